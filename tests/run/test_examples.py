"""The shipped example configs: each one loads and assembles (components built, pieces checked),
and the two Cora-features examples are the demo's rows (the README's relational curves use them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _paths import REPO

from graphveil.apps.demo import demo_configs
from graphveil.run.config import load_config
from graphveil.run.session import TrainingSession

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_assembles(path: Path) -> None:
    # every component built from its options, and the sampler/clipper/accountant/unit checks passed
    session = TrainingSession(load_config(path))
    session.assemble()
    assert session.encoder is not None


@pytest.mark.parametrize(("example", "row"), [("cora_features_edge.yaml", "edge"),
                                              ("cora_features_entity.yaml", "entity_standard")])
def test_cora_examples_are_the_demo_rows(example: str, row: str) -> None:
    cfg = load_config(EXAMPLES[0].parent / example)
    demo = {c.name: c for _, c in demo_configs(progress=False)}[row]
    for section in ("data", "sampler", "clipper", "accountant", "encoder", "training", "evaluation"):
        assert getattr(cfg, section) == getattr(demo, section), section
    assert cfg.privacy.target_epsilon == demo.privacy.target_epsilon == 10
