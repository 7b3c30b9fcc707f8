"""Run configs of paper 4's GDP methods and DP-SAGE, shared by the gdp tests (no tests here)."""

from __future__ import annotations

from typing import Any

from graphveil.plugins.gdp.dp_sage import OUTPUTS
from graphveil.run.config import config_from_dict

#: privacy-unit labels of the runs (``.format(D=..., k=...)`` where they take a bound)
NODE = "node/replacement/D={D}/predictions"
KNB = "k_neighbor/replacement/k={k}/D={D}/predictions"
EDGE = "edge/replacement/predictions"
UNDIRECTED = "undirected_edge/replacement/predictions"
BATCH = 16
#: DP-SAGE's runs: degree bound D and hops (its tests' graph is ``node_graph_within(SAGE_D)``)
SAGE_D, SAGE_HOPS = 3, 1


def gdp_config(method: str, unit: str | None, *, epochs: float = 0.2, privacy: dict | None = None,
               model: dict | None = None, noise_seed: int | None = 7, **method_params: Any) -> Any:
    features = {"gap": "released:gap_aggregates", "dpdgc": "released:dpdgc_embedding", "dp_sgd": "raw"}[method]
    stage = {"epochs": epochs, "batch_size": BATCH}
    params = ({"hops": 2, "hidden": 8, "encoder_training": stage} if method == "gap"
              else {"hidden": 8, "embedding_training": stage} if method == "dpdgc" else {})
    params.update(method_params)
    private = {"target_epsilon": 8.0, "research_noise_seed": noise_seed}
    if unit is not None:
        private["unit"] = unit
    return config_from_dict({
        "name": f"gdp-{method}", "seed": 3,
        "data": {"split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}},
        "method": {"name": method, **params},
        "sampler": {"name": "node_uniform_wor", "batch_size": BATCH},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "task": {"name": "node_classification", "features": features},
        "model": model or ({"name": "linkx", "hidden": 8, "embedding_width": 8, "seed": 0} if method == "dpdgc"
                           else {"name": "mlp", "hidden": 8, "layers": 2, "seed": 0}),
        "training": {"epochs": epochs, "lr": 0.01},
        "privacy": privacy or private,
        "output": {"progress": False},
    })


def rand_edge_config(unit: str | None, eps: float | None = 2.0) -> Any:
    privacy = {"enabled": False} if eps is None else {"target_epsilon": eps, "unit": unit}
    return config_from_dict({
        "name": "randedge", "seed": 3,
        "data": {"split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}},
        "method": {"name": "rand_edge_sage"},
        "sampler": {"name": "node_uniform_wor", "batch_size": BATCH},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "task": {"name": "node_classification", "graph": "released:rand_edge"},
        "model": {"name": "sage_full", "hidden": 8, "seed": 0},
        "training": {"steps": 5, "lr": 0.01},
        "privacy": privacy, "output": {"progress": False},
    })


def sage_config(*, unit_label: str | None = f"node/replacement/D={SAGE_D}/predictions",
                hops: int = SAGE_HOPS, sampler_hops: int | None = None,
                predictions: str | None = f"released:{OUTPUTS}", scale: float = 1.0, privacy: dict | None = None) -> Any:
    private = {"target_epsilon": 8.0, "research_noise_seed": 5, **({"unit": unit_label} if unit_label else {})}
    task = {"name": "rooted_node_classification", **({"predictions": predictions} if predictions else {})}
    return config_from_dict({
        "name": "dp-sage", "seed": 3,
        "data": {"split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}},
        "method": {"name": "dp_sage", "output_clip": 0.5, "output_noise_scale": scale},
        "sampler": {"name": "root_subgraphs", "batch_size": BATCH, "num_hops": hops if sampler_hops is None else sampler_hops},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "rooted_rdp"},
        "task": task,
        "model": {"name": "sage", "hidden": 8, "layers": hops, "seed": 0},
        "training": {"steps": 4, "lr": 0.01},
        "privacy": privacy or private,
        "output": {"progress": False},
    })
