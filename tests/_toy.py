"""Small graphs and run configs shared by tests in several folders (no tests in this module)."""

from __future__ import annotations

from typing import Any

import torch

from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.run.config import PrivacyConfig, RunConfig, config_from_dict

# ------------------------------------------------------------ the relational end-to-end runs

N_NODES = 96
K, K_NEG, BATCH = 4, 2, 8

METHODS = {
    "entity_standard": ("entity_poisson_wor", "standard_clip", "coupled_rdp_standard"),
    "entity_freq": ("entity_poisson_wor", "freq_clip", "coupled_rdp_freq"),
    "edge": ("edge_poisson_decoupled", "per_tuple_clip", "edge_rdp"),
}


def toy_graph() -> RelationalGraph:
    """96 entities with short texts, ~260 random relations (many degrees above K)."""
    gen = torch.Generator().manual_seed(11)
    e = torch.randint(0, N_NODES, (400, 2), generator=gen)
    e = torch.stack([e.min(1).values, e.max(1).values], 1)
    e = torch.unique(e[e[:, 0] != e[:, 1]], dim=0)
    words = ["graph", "privacy", "noise", "learning", "citation", "entity", "model", "budget"]
    texts = [f"paper {i} on " + " ".join(words[(i * j) % len(words)] for j in range(1, 2 + i % 5))
             for i in range(N_NODES)]
    return RelationalGraph("toy", [f"p{i}" for i in range(N_NODES)], e, texts=texts)


def make_config(method: str, *, sigma: float, clip_norm: float, lr: float, seed: int = 2024,
                degree_cap: int = K) -> RunConfig:
    sampler, clipper, accountant = METHODS[method]
    sampler_cfg = {"name": sampler, "batch_size": BATCH, "k_neg": K_NEG}
    if sampler.startswith("entity"):
        sampler_cfg["degree_cap"] = degree_cap
    privacy = {"noise_multiplier": sigma, "delta": 1e-5}
    if "secure_rng" in PrivacyConfig.model_fields:  # before issue 6: the CSPRNG is opt-in
        privacy["secure_rng"] = True
    raw = {
        "name": f"e2e-{method}",
        "data": {"split": {"train_fraction": 0.75, "seed": 3}},
        "sampler": sampler_cfg,
        "clipper": {"name": clipper, "clip_norm": clip_norm},
        "accountant": {"name": accountant},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 1, "optimizer": "sgd", "lr": lr, "temperature": 0.2},
        "privacy": privacy,
        "output": {"progress": False},
        "seed": seed,  # sampling only; the noise never depends on it
    }
    return config_from_dict(raw)


# ------------------------------------------------------------ the lifecycle-hook runs

def small_relational_graph(n: int = 60, m: int = 240) -> RelationalGraph:
    """n entities with short texts, about m random relations (the lifecycle-hook runs)."""
    gen = torch.Generator().manual_seed(3)
    e = torch.randint(0, n, (m, 2), generator=gen)
    e = torch.stack([e.min(1).values, e.max(1).values], 1)
    e = torch.unique(e[e[:, 0] != e[:, 1]], dim=0)
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], e,
                           texts=[f"entity {i} " + "word " * (i % 4) for i in range(n)])


# ------------------------------------------------------------ the node-level runs

def toy_nodes() -> NodeGraph:
    """120 nodes on a path, 12 features that separate 3 classes (the node-level e2e and sweep runs)."""
    n, features, classes = 120, 12, 3
    gen = torch.Generator().manual_seed(3)
    y = torch.randint(0, classes, (n,), generator=gen)
    x = torch.randn(n, features, generator=gen) * 5 + y[:, None].float()
    u = torch.arange(n - 1)
    edges = torch.cat([torch.stack([u, u + 1]), torch.stack([u + 1, u])], 1)
    return NodeGraph("toy", x, y, edges, [f"n{i}" for i in range(n)], [f"c{i}" for i in range(classes)])


# ------------------------------------------------------------ the CLI's tiny private run (CiteSeer)

#: a private run small enough for the CLI tests (and the SQL source's run through the CLI)
TINY = {
    "name": "tiny",
    "data": {"source": "citeseer", "max_entities": 500, "split": {"train_fraction": 0.6}},
    "sampler": {"name": "entity_poisson_wor", "batch_size": 12, "k_neg": 2, "degree_cap": 4},
    "clipper": {"name": "freq_clip", "clip_norm": 1.0},
    "accountant": {"name": "coupled_rdp_freq"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
    "training": {"steps": 4, "lr": 0.01},
    "privacy": {"target_epsilon": 8.0},
    "evaluation": {"batch_size": 64},
}


def tiny_lora_encoder(texts: list[str], *, weight_seed: int = 0, **params: Any) -> Any:
    """tiny-bert + LoRA (built from a config: nothing downloaded) with every trainable weight
    drawn from N(0, 0.3²) by a generator seeded ``weight_seed`` (lora_B starts at 0: random
    weights give every factor a gradient), prepared on a relation-free graph of ``texts``.
    ``params``: the other :class:`HfLoraParams` fields (max_length, lora_layers, seed, ...)."""
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams

    enc = HfLoraEncoder(HfLoraParams(model="tiny-bert", **params))
    gen = torch.Generator().manual_seed(weight_seed)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    enc.prepare(RelationalGraph("toy", [str(i) for i in range(len(texts))], torch.zeros(0, 2, dtype=torch.long),
                                texts=texts))
    return enc
