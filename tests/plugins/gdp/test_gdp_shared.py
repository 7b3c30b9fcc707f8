"""What GAP and DPDGC share with a federation (issue 27 point 2): GAP's trained encoder leaves with
the classifier and the next release starts from given weights, charged exactly as before; its
aggregates never join the shared state; DPDGC shares no weights, and its projection R is fixed by
the task (``projection_seed``), not by the run's seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _gdp_runs import NODE, gdp_config
from _graphs import node_graph_within

from graphveil.contract.errors import ConfigError
from graphveil.contract.host import PluginHost
from graphveil.plugins.gdp.common import row_normalise
from graphveil.plugins.gdp.modules import FeatureEncoder
from graphveil.run.session import RELEASE_KEY, TrainingSession

graph = node_graph_within(3)
ENC = "gap_encoder"
#: an encoder learning rate so small that the trained encoder stays within 1e-4 of its start
#: (Adam moves each weight by about lr per step), so the start can be read off the result
FROZEN = {"epochs": 0.2, "batch_size": 16, "lr": 1e-7}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


def _gap(host: PluginHost, *, seed: int = 3, **params: Any) -> TrainingSession:
    cfg = gdp_config("gap", NODE.format(D=3), encoder_layers=1, **params).model_copy(update={"seed": seed})
    session = TrainingSession(cfg, host=host, graph=graph())
    session.prepare_accounting()
    return session


def _encoder(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefix = ENC + RELEASE_KEY
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def test_gap_shares_its_trained_encoder_and_never_its_aggregates(host: PluginHost) -> None:
    session = _gap(host, encoder_seed=5)
    assert session.trainable_state().keys() == session.encoder.trainable_state().keys() == set()  # nothing ran yet
    session.prepare()
    state = session.trainable_state()
    mechanism = session.plan.releases[0].mechanism
    encoder = _encoder(state)
    assert set(encoder) == {"encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"}
    assert all(torch.equal(encoder[k], v) for k, v in mechanism.model.trainable_state().items())
    model_keys = {k for k in state if RELEASE_KEY not in k}
    assert model_keys == set(session.encoder.trainable_state()) and model_keys  # the classifier
    assert set(state) == model_keys | {ENC + RELEASE_KEY + k for k in encoder}  # nothing of the aggregates


def test_gap_starts_its_encoder_from_given_weights_at_the_same_cost(host: PluginHost) -> None:
    """The release trains from the weights it was handed (H⁽⁰⁾ is their embedding) and composes
    exactly the events of a release from its own initialisation."""
    reference = _gap(host, encoder_seed=5, encoder_training=FROZEN)
    reference.prepare()
    initial = _encoder(reference.trainable_state())
    start = {k: v + 0.25 for k, v in initial.items()}  # far (0.25) from the seeded start
    session = _gap(host, encoder_seed=5, encoder_training=FROZEN)
    rest = session.start_releases_from({**{ENC + RELEASE_KEY + k: v for k, v in start.items()},
                                        "net.0.bias": torch.zeros(8)})
    assert set(rest) == {"net.0.bias"}  # the model's keys come back for load_trainable_state
    session.prepare()
    trained = _encoder(session.trainable_state())
    for key, value in start.items():
        assert torch.allclose(trained[key], value, atol=1e-4), key
        assert not torch.allclose(trained[key], initial[key], atol=0.1), key
    model = FeatureEncoder(24, 3, 8, 1)
    model.load_trainable_state(trained)
    model.eval()
    h0 = session.released["gap_aggregates"][:, :8]
    assert torch.allclose(h0, row_normalise(model.embed(graph().x)), atol=1e-5)  # H0 from the started encoder
    assert session.noise_multiplier == reference.noise_multiplier
    np.testing.assert_array_equal(session.accountant.total_rdp(), reference.accountant.total_rdp())
    assert session.accountant.total_rdp().max() > 0


def test_encoder_seed_pins_the_first_encoder_whatever_the_runs_seed(host: PluginHost) -> None:
    runs = {}
    for seed, encoder_seed in ((3, 5), (4, 5), (3, 6)):
        session = _gap(host, seed=seed, encoder_seed=encoder_seed, encoder_training=FROZEN)
        session.prepare()
        runs[seed, encoder_seed] = _encoder(session.trainable_state())
    same, other = runs[3, 5], runs[4, 5]
    assert all(torch.allclose(same[k], other[k], atol=1e-4) for k in same)  # same encoder_seed, other run seed
    assert not torch.allclose(same["encoder.0.weight"], runs[3, 6]["encoder.0.weight"], atol=1e-2)


def test_release_weights_are_refused_after_the_releases_or_where_no_release_takes_them(host: PluginHost) -> None:
    session = _gap(host, encoder_seed=5)
    with pytest.raises(ConfigError, match="Pma trains no weights to start from"):
        session.start_releases_from({"gap_aggregates/x": torch.zeros(1)})
    with pytest.raises(ConfigError, match="'nope' is no release before training"):
        session.start_releases_from({"nope/x": torch.zeros(1)})
    wrong = _gap(host, encoder_seed=5)
    wrong.start_releases_from({ENC + RELEASE_KEY + "encoder.0.weight": torch.zeros(8, 24)})
    with pytest.raises(ConfigError, match="weights to start from: key 'encoder.0.bias' is missing"):
        wrong.prepare()
    shape = _gap(host, encoder_seed=5)
    good = _gap(host, encoder_seed=5)
    good.prepare()
    bad = {**_encoder(good.trainable_state()), "head.bias": torch.zeros(2)}
    shape.start_releases_from({ENC + RELEASE_KEY + k: v for k, v in bad.items()})
    with pytest.raises(ConfigError, match=r"key 'head.bias' is torch.float32 \[2\], expected torch.float32 \[3\]"):
        shape.prepare()
    with pytest.raises(ConfigError, match="release weights load before the releases run"):
        good.start_releases_from(good.trainable_state())
    with pytest.raises(ConfigError, match="is a release's weight"):
        good.load_trainable_state(good.trainable_state())


def test_dpdgc_shares_no_weights_and_its_projection_follows_the_task_not_the_run(host: PluginHost) -> None:
    heads = {}
    for seed, projection_seed in ((3, 11), (4, 11), (3, None), (4, None)):
        cfg = gdp_config("dpdgc", NODE.format(D=3), projection_seed=projection_seed).model_copy(update={"seed": seed})
        session = TrainingSession(cfg, host=host, graph=graph())
        session.prepare()
        assert all(RELEASE_KEY not in k for k in session.trainable_state())  # LINKX only: W⁽ᴬ⁾ is per graph
        heads[seed, projection_seed] = session.plan.releases[0].mechanism.model.head
        with pytest.raises(ConfigError, match="DpEmbedding trains no weights to start from"):
            session.plan.releases[0].mechanism.start_from({"linear.weight": torch.zeros(1)})
    assert torch.equal(heads[3, 11], heads[4, 11])  # one R for every site and round
    assert not torch.equal(heads[3, None], heads[4, None])  # without it: the run's seed draws R
