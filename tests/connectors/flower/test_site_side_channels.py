"""What a site's replies reveal, end to end through ``handle_train`` with real sessions.

Two neighbouring datasets, or graphs of different sizes, must give replies of the same kind
with the same fields; only the DP update's values may differ (issue 25, points 1 and 2).

* The overflow attack: a server sends a finite, correctly shaped head with one weight so large
  that the one training entity whose feature exceeds a threshold overflows. Before, that
  entity's tuples made the loss NaN, clipping raised, and the reply said ``failed`` — one
  entity's data read off the round status with no ε charged.
* The size probe: a server sweeping ``sampler.batch_size`` across the graph size learned the
  number of training relations from where ``prepare`` started to fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _fed_support import init_site_ledger, public_view, site_context

from graphveil.connectors.flower import records
from graphveil.connectors.flower.site import handle_train
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost
from graphveil.data.split import split_key, split_position
from graphveil.run.session import TrainingSession

pytestmark = pytest.mark.usefixtures("flower_task")

TRAIN_FRACTION = 0.8
WIDTH = 6
#: The crafted weight, near float32's max / 2: entities whose feature 0 is ≤ 1 keep a finite
#: head output, the one entity with feature 1e4 > 2 overflows to ∞ (and its cosine scores to NaN).
ATTACK_WEIGHT = 1.5e38


def _training_ids(n: int) -> list[int]:
    key = split_key(0)
    return [i for i in range(n) if split_position(key, str(i)) < TRAIN_FRACTION]


def write_graph(path: Path, n: int, *, target: bool, seed: int = 0) -> Path:
    """A ring-with-chords feature graph of ``n`` entities (features in [0, 1]); with ``target``,
    one training-side entity (the neighbour's difference) has feature 0 equal to 1e4."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, WIDTH, generator=gen)
    src = torch.arange(n)
    pairs = torch.cat([torch.stack([src, (src + 1) % n]), torch.stack([src, (src + 7) % n])], 1)
    if target:
        x[_training_ids(n)[0], 0] = 1e4
    torch.save(Data(x=x, edge_index=pairs), path)
    return path


def run_config(**task: Any) -> dict[str, Any]:
    base = {
        "num-server-rounds": 1, "local-steps": 3, "min-sites": 1,
        "task.sampler.name": "edge_poisson_decoupled", "task.sampler.batch_size": 8, "task.sampler.k_neg": 2,
        "task.clipper.name": "per_tuple_clip", "task.clipper.clip_norm": 1.0, "task.accountant.name": "edge_rdp",
        "task.encoder.name": "frozen_head", "task.encoder.model": "features", "task.encoder.head": "diagonal",
        "task.training.temperature": 0.05, "task.privacy.noise_multiplier": 1.0,
    }
    return {**base, **{f"task.{k}": v for k, v in task.items()}}


def node_config(folder: Path, data: Path, **extra: Any) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    split = folder / "site.yaml"
    split.write_text(f"data:\n  split: {{train_fraction: {TRAIN_FRACTION}, seed: 0}}\n")
    cfg = {"site-name": "clinic", "data-source": "pyg", "data-path": str(data), "epsilon-budget": 100.0,
           "delta": 1e-6, "privacy-unit": "edge", "min-records": 40, "ledger": str(folder / "ledger.sqlite"),
           "site-config": str(split), "prepared-cache": "off", **extra}
    return init_site_ledger(cfg)  # the site's operator ran `graphveil budget init` once


class _Steps:
    """Records what each step reports at the site (its own log, never sent)."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []

    @hookimpl
    def graphveil_step_end(self, step: int, metrics: Any) -> None:
        self.metrics.append(dict(metrics))


def _factory(steps: _Steps):
    host = PluginHost()
    host.register(steps, "steps")
    return lambda config, records_store=None: TrainingSession(config, host=host, records_store=records_store)


def _attack_state() -> dict[str, torch.Tensor]:
    head = torch.ones(WIDTH)
    head[0] = ATTACK_WEIGHT
    return {"scale.weight": head}


def _reply(tmp_path: Path, name: str, *, target: bool, node: dict[str, Any], run: dict[str, Any],
           state: dict[str, torch.Tensor], steps: _Steps | None = None) -> records.RecordDict:
    data = write_graph(tmp_path / f"{name}.pt", 60, target=target)
    cfg = node_config(tmp_path / name, data, **node)
    content = records.train_content(records.arrays_from_state(state), 1, 3)
    factory = _factory(steps or _Steps())
    return handle_train(content, site_context(5, cfg, run), session_factory=factory)


def test_the_attack_task_is_refused_by_the_default_policy_before_the_data_is_read(tmp_path: Path) -> None:
    run = run_config(**{"encoder.normalize": False})
    replies = [_reply(tmp_path, name, target=target, node={}, run=run, state=_attack_state())
               for name, target in (("with", True), ("without", False))]
    described = [public_view(r) for r in replies]
    assert described[0] == described[1]
    assert described[0]["site"]["values"]["status"] == records.REFUSED
    assert "encoder.normalize" in described[0]["site"]["values"]["reason"]
    # and a weight above the site's max-abs-weight is refused on its own, with normalisation on
    loud = _reply(tmp_path, "loud", target=True, node={}, run=run_config(), state=_attack_state())
    assert "max-abs-weight" in loud.config_records[records.SITE]["reason"]


def test_an_overflowing_entity_changes_no_reply_field_even_when_the_site_allows_the_numerics(tmp_path: Path) -> None:
    """The site pins normalisation off and accepts any weight: the crafted head reaches training.
    The entity's tuples overflow (counted at the site) and contribute 0; both neighbouring
    datasets get a trained reply with the same fields, shapes and scalars."""
    pins = tmp_path / "pins.yaml"
    pins.write_text(f"encoder: {{normalize: false}}\ndata:\n  split: {{train_fraction: {TRAIN_FRACTION}, seed: 0}}\n")
    node = {"site-config": str(pins), "max-abs-weight": 3e38, "seed": 1}  # the site's seed: same batches
    run = run_config(**{"encoder.normalize": False, "sampler.batch_size": 40})
    logs = {True: _Steps(), False: _Steps()}
    replies = {target: _reply(tmp_path, f"d{int(target)}", target=target, node=node, run=run,
                              state=_attack_state(), steps=logs[target]) for target in (True, False)}
    described = {t: public_view(r) for t, r in replies.items()}
    assert described[True] == described[False]
    assert described[True]["site"]["values"]["status"] == records.TRAINED
    sent = {t: records.state_from_arrays(r.array_records[records.ARRAYS]) for t, r in replies.items()}
    assert all(bool(torch.isfinite(s["scale.weight"]).all()) for s in sent.values())
    # the neighbour's entity did overflow (at the site only), and nothing else did
    assert sum(m["nonfinite"] for m in logs[True].metrics) > 0
    assert sum(m["nonfinite"] for m in logs[False].metrics) == 0
    assert len(logs[True].metrics) == len(logs[False].metrics) == 3


@pytest.mark.parametrize("budget", [100.0, 4.0])
def test_a_batch_size_sweep_gives_the_same_replies_on_graphs_of_different_sizes(tmp_path: Path, budget: float) -> None:
    """Batch sizes from below to far above the graphs' relation counts (≈ 96 and ≈ 300 training
    relations): each b gives the same status, reason and scalars on both graphs — trained, or
    refused for the budget at the same b (ε is computed from the public min-records)."""
    sizes = {"small": 60, "large": 190}
    data = {k: write_graph(tmp_path / f"{k}.pt", n, target=False) for k, n in sizes.items()}
    seen: dict[int, list[dict[str, Any]]] = {}
    for b in (4, 50, 100, 200, 400):
        for name, path in data.items():
            cfg = node_config(tmp_path / f"{name}-{b}", path, **{"min-records": 400, "epsilon-budget": budget,
                                                                  "share-epsilon": True})
            content = records.train_content(records.arrays_from_state({"scale.weight": torch.ones(WIDTH)}), 1, 3)
            reply = handle_train(content, site_context(5, cfg, run_config(**{"sampler.batch_size": b})),
                                 session_factory=_factory(_Steps()))
            seen.setdefault(b, []).append(public_view(reply))
    statuses = {b: replies[0]["site"]["values"]["status"] for b, replies in seen.items()}
    for replies in seen.values():
        assert replies[0] == replies[1]
    if budget == 100.0:
        assert set(statuses.values()) == {records.TRAINED}
    else:  # a budget that the larger batches' rates exceed: refused at the same b on both graphs
        assert [statuses[b] for b in (4, 50, 100, 200, 400)] == [records.TRAINED] * 2 + [records.REFUSED] * 3
