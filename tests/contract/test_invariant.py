"""The invariant: a run whose accountant cannot analyse its sampler/clipper is refused before data."""

from __future__ import annotations

import pytest

from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.run.config import config_from_dict
from graphveil.run.session import TrainingSession

ENTITY = {"name": "entity_poisson_wor", "batch_size": 8, "k_neg": 2, "degree_cap": 3}
ENTITY_WR = {"name": "entity_poisson_wr", "batch_size": 8, "k_neg": 2, "degree_cap": 3}
EDGE = {"name": "edge_poisson_decoupled", "batch_size": 8, "k_neg": 2}


def session(sampler, clipper, accountant, **privacy) -> TrainingSession:
    cfg = config_from_dict({
        "data": {"source": "edge_list", "path": "/nonexistent/edges.csv", "entities": "/nonexistent/e.csv"},
        "sampler": sampler, "clipper": clipper, "accountant": {"name": accountant},
        "encoder": {"name": "hf_lora", "model": "tiny-bert"},
        "privacy": privacy or {"target_epsilon": 4.0},
    })
    return TrainingSession(cfg)


@pytest.mark.parametrize(
    ("sampler", "clipper", "accountant", "names"),
    [
        # Thm 3 assumes FREQ-CLIP's constant sensitivity; standard clipping needs Thm C.1.
        (ENTITY, {"name": "standard_clip"}, "coupled_rdp_freq", ("coupled_rdp_freq", "standard_clip")),
        # FREQ-CLIP's bound needs |B-(u)| <= 1, which negatives drawn with replacement break.
        (ENTITY_WR, {"name": "freq_clip"}, "coupled_rdp_freq", ("entity_poisson_wr", "freq_clip")),
        # An edge-level accountant cannot back an entity-level claim.
        (ENTITY, {"name": "freq_clip"}, "edge_rdp", ("edge_rdp", "freq_clip")),
        (EDGE, {"name": "per_tuple_clip"}, "coupled_rdp_freq", ("edge_poisson_decoupled", "per_tuple_clip")),
    ],
)
def test_mismatch_refused_before_data(sampler, clipper, accountant, names) -> None:
    s = session(sampler, clipper, accountant)
    with pytest.raises(ProfileMismatchError) as info:
        s.assemble()
    for name in names:
        assert name in str(info.value)
    assert s.graph is None  # nothing was read (the data paths do not even exist)


def test_matching_pairs_assemble() -> None:
    session(ENTITY, {"name": "freq_clip"}, "coupled_rdp_freq").assemble()
    session(ENTITY, {"name": "standard_clip"}, "coupled_rdp_standard").assemble()
    session(EDGE, {"name": "per_tuple_clip"}, "edge_rdp").assemble()


def test_private_run_without_clipping_refused() -> None:
    with pytest.raises(PrivacyError):
        session(ENTITY, {"name": "no_clip"}, "no_accounting").assemble()
    session(ENTITY, {"name": "no_clip"}, "no_accounting", enabled=False).assemble()
