"""TrainingSession.prepare_accounting / planned_rdp: the RDP a federated site reserves for a round
before any release runs equals what the run then composes (releases before training + steps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _toy import toy_nodes

from graphveil.run.config import config_from_dict
from graphveil.run.session import TrainingSession

BASE = {
    "name": "planned",
    "data": {"source": "planetoid", "split": {"kind": "random_node", "val_fraction": 0.2, "test_fraction": 0.2}},
    "task": {"name": "node_classification"},
    "model": {"name": "mlp", "hidden": 8, "layers": 2, "seed": 0},
    "sampler": {"name": "node_uniform_wor", "batch_size": 16},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
    "accountant": {"name": "node_rdp"},
    "training": {"steps": 6, "lr": 0.01},
    "privacy": {"noise_multiplier": 1.5, "delta": 1e-4},
}
GAP = {
    **BASE,
    "method": {"name": "gap", "hops": 2, "hidden": 8, "encoder_layers": 1,
               "encoder_training": {"epochs": 2, "batch_size": 16, "lr": 0.01, "clip_norm": 1.0}},
    "task": {"name": "node_classification", "features": "released:gap_aggregates"},
    "privacy": {"noise_multiplier": 1.5, "delta": 1e-4, "unit": "node/replacement/D=4/predictions"},
}


@pytest.mark.parametrize("raw", [BASE, GAP], ids=["dp_mlp", "gap"])
def test_the_planned_curve_is_what_the_round_composes(raw: dict) -> None:
    torch.set_num_threads(1)
    session = TrainingSession(config_from_dict(raw, "test"), graph=toy_nodes())
    session.prepare_accounting()
    assert session.released == {}  # nothing released yet
    assert not session.accountant.total_rdp().any()
    planned = session.planned_rdp(3)
    session.prepare()
    session.train(3)
    assert np.allclose(planned, session.accountant.total_rdp(), rtol=1e-9, atol=0)
    assert planned.max() > 0
    # releases count once: with no steps the plan is the releases alone
    releases = session.accountant.events_rdp()
    assert np.allclose(session.planned_rdp(0), releases)
    assert bool(releases.any()) == ("method" in raw)
