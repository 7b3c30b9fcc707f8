"""Privacy of a run (issue 6): CSPRNG noise apart from sampling, the research seed, δ, Ē persistence."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.data.graph import RelationalGraph
from graphveil.engine import noise as noise_module
from graphveil.engine import noise_kernel
from graphveil.engine.noise import GaussianNoise, csprng_bytes, secure_standard_normal
from graphveil.privacy import default_delta
from graphveil.privacy.delta import DEFAULT_DELTA_RULE
from graphveil.run.config import config_from_dict
from graphveil.run.records_store import FileRecordsStore, MemoryRecordsStore, records_key
from graphveil.run.runner import run_training
from graphveil.run.session import TrainingSession


def toy_graph(n: int = 90, m: int = 400) -> RelationalGraph:
    gen = torch.Generator().manual_seed(5)
    e = torch.randint(0, n, (m, 2), generator=gen)
    e = torch.stack([e.min(1).values, e.max(1).values], 1)
    e = torch.unique(e[e[:, 0] != e[:, 1]], dim=0)
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], e,
                           texts=[f"entity {i} " + "word " * (i % 5) for i in range(n)])


GRAPH = toy_graph()

ENTITY_RUN = {
    "name": "toy",
    "sampler": {"name": "entity_poisson_wor", "batch_size": 6, "k_neg": 2, "degree_cap": 3},
    "clipper": {"name": "freq_clip", "clip_norm": 1.0},
    "accountant": {"name": "coupled_rdp_freq"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 8, "lora_layers": 1},
    "training": {"steps": 1, "lr": 0.01, "optimizer": "sgd"},
    "privacy": {"noise_multiplier": 1.0},
    "evaluation": {"batch_size": 16},
    "output": {"progress": False},
    "data": {"split": {"train_fraction": 0.6}},
}
EDGE_RUN = {**ENTITY_RUN, "sampler": {"name": "edge_poisson_decoupled", "batch_size": 6, "k_neg": 2},
            "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0}, "accountant": {"name": "edge_rdp"}}


def make_config(base: dict = ENTITY_RUN, **top):
    raw = json.loads(json.dumps(base))
    privacy = top.pop("privacy", None)
    if privacy is not None:
        raw["privacy"] = {**raw["privacy"], **privacy}
    raw.update(top)
    return config_from_dict(raw)


def session(base: dict = ENTITY_RUN, store=None, **top) -> TrainingSession:
    s = TrainingSession(make_config(base, **top), graph=GRAPH, records_store=store)
    s.prepare()
    return s


def one_step_state(**top) -> dict[str, torch.Tensor]:
    s = session(**top)
    s.train(1)
    return s.trainable_state()


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- noise source


def test_noise_differs_between_sessions_even_with_the_same_sampling_seed() -> None:
    """Fails if the noise came from the (seeded) sampling generator: batches and clipped sums are
    equal in both sessions, so only the noise can make the released updates differ."""
    a, b = session(seed=3), session(seed=3)
    assert torch.equal(a.sampler.sample(a.generator).positives, b.sampler.sample(b.generator).positives)
    assert not same_state(one_step_state(seed=3), one_step_state(seed=3))


def test_noise_differs_without_any_seed() -> None:
    assert not same_state(one_step_state(), one_step_state())


def test_sampling_and_noise_generators_are_distinct() -> None:
    s = session(seed=1)
    assert s.noise is not None and s.noise.mode == "csprng-4sum" and s.noise.generator is None
    r = session(seed=1, privacy={"research_noise_seed": 9})
    assert r.noise.generator is not None and r.noise.generator is not r.generator
    assert r.noise.mode == "research-seed"


def test_noise_does_not_depend_on_the_sampling_seed() -> None:
    draws = [session(seed=seed, privacy={"research_noise_seed": 4}).noise.sample((500,), 1.0)
             for seed in (1, 2)]
    assert torch.equal(*draws)
    assert not torch.equal(draws[0], GaussianNoise(research_seed=5).sample((500,), 1.0))


def test_research_seed_reproduces_the_run_and_is_recorded() -> None:
    privacy = {"research_noise_seed": 17}
    assert same_state(one_step_state(seed=2, privacy=privacy), one_step_state(seed=2, privacy=privacy))
    report = session(seed=2, privacy=privacy).privacy_report()
    assert report["noise"] == "research-seed" and report["research_noise_seed_set"] is True
    assert report["sampling_seed"] == "fixed"
    plain = session().privacy_report()
    assert plain["noise"] == "csprng-4sum" and plain["research_noise_seed_set"] is False
    assert plain["noise_transform"] == (f"c-kernel-{noise_kernel.KERNEL.simd}" if noise_kernel.KERNEL else "torch")
    assert plain["sampling_seed"] == "fresh"


@pytest.mark.parametrize("research_seed", [None, 3])
def test_4sum_noise_has_the_right_mean_and_variance(research_seed) -> None:
    """1e6 draws; bounds at 6 standard errors (false alarm ≈ 2e-9 per check)."""
    n, std = 1_000_000, 2.5
    x = GaussianNoise(research_seed=research_seed).sample((n,), std, dtype=torch.float64)
    assert abs(float(x.mean())) < 6 * std / math.sqrt(n)
    var = float(x.var())
    # Var of the sample variance of a normal: 2σ⁴/(n-1)
    assert abs(var - std**2) < 6 * std**2 * math.sqrt(2 / (n - 1))
    # fourth moment of a normal: 3σ⁴ (checks the shape, not only the scale); Var(z⁴) = 96σ⁸
    z4 = float((x / std).pow(4).mean())
    assert abs(z4 - 3.0) < 6 * math.sqrt(96 / n)


def test_csprng_bytes_are_fresh_and_uniform() -> None:
    """Every draw has its own key and counter (two draws never repeat), and the keystream's
    bytes are uniform (χ² over 256 values on 1 MiB, 255 d.o.f.: mean 255, sd 22.6)."""
    a, b = csprng_bytes(64), csprng_bytes(64)
    assert len(a) == 64 and a != b and a[:32] != b[32:]
    counts = torch.bincount(torch.frombuffer(csprng_bytes(1 << 20), dtype=torch.uint8).long(), minlength=256).double()
    chi2 = float(((counts - 4096) ** 2 / 4096).sum())
    assert 255 - 6 * 22.6 < chi2 < 255 + 6 * 22.6


# ----------------------------------------------------------------------------- the noise stream
# (issue 29: the AES keystream in threads, the fused 4-uniform Box–Muller sum, the device path)

#: one tail of every two-sided statistical bound below
TAIL = 1e-9
#: largest Box–Muller radius from a 53-bit uniform u ≥ 2⁻⁵³: √(−2 ln 2⁻⁵³) ≈ 8.57
MAX_RADIUS = math.sqrt(-2 * math.log(2.0**-53))


def reference_transform(words: np.ndarray) -> np.ndarray:
    """√2·z of the module note for a (2, k + 1) array of uniform 64-bit words (rows u, v: pair j
    is (u_j, v_j)), written independently of the module: numpy's log1p and libm's sin and cos.
    Coordinate j = r_j sin φ_j + r_{j+1} cos φ_{j+1}."""
    w = (words.astype(np.uint64) & np.uint64(2**53 - 1)).astype(np.float64) * 2.0**-53
    radius, angle = np.sqrt(-2.0 * np.log1p(-w[0])), 2 * np.pi * w[1]
    return radius[:-1] * np.sin(angle[:-1]) + radius[1:] * np.cos(angle[1:])


def reference_noise(secret: bytes, n: int) -> np.ndarray:
    """√2·z for a draw of n coordinates with the layout of the module note, built independently:
    chunk c (B coordinates, the last k) encrypts its counter blocks ``N_c ‖ 2 … N_c ‖ B + 2``
    (N_c = N + c mod 2⁹⁶, a 32-bit big-endian counter) one by one with AES-256 in ECB mode."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    chunk, out = noise_module._CHUNK, []
    ecb = Cipher(algorithms.AES(secret[:32]), modes.ECB()).encryptor()
    for c, s in enumerate(range(0, n, chunk)):
        pairs = min(chunk, n - s) + 1
        nonce = ((int.from_bytes(secret[32:44], "big") + c) % (1 << 96)).to_bytes(12, "big")
        blocks = b"".join(nonce + (2 + i).to_bytes(4, "big") for i in range(pairs))
        words = np.frombuffer(ecb.update(blocks), dtype=np.uint64)
        out.append(reference_transform(words.reshape(2, pairs)))
    return np.concatenate(out)


def binomial_bounds(n: int, p: float) -> tuple[float, float]:
    from scipy import stats

    return stats.binom.ppf(TAIL, n, p), stats.binom.isf(TAIL, n, p)


@pytest.fixture(params=["kernel", "torch"])
def transform(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The noise's CPU transform: the fused C kernel (if the install built it) or the torch one
    (also the device path's arithmetic)."""
    if request.param == "torch":
        monkeypatch.setattr(noise_kernel, "KERNEL", None)
    elif noise_kernel.KERNEL is None:
        pytest.skip("the install has no noise kernel (graphveil.engine._noise_kernel)")
    return request.param


@pytest.mark.parametrize("threads", [1, 2])
def test_keystream_noise_is_the_reference_computation(threads: int, transform: str) -> None:
    """Pins the whole CPU path to an independent reference: AES-256 of each chunk's explicit
    counter blocks under the draw's key and nonce (ECB), 53-bit uniforms, and per coordinate the
    sum of TWO Box–Muller outputs of two DIFFERENT pairs (four uniforms: this pair's sine, the
    next pair's cosine). Spans several chunks and a partial last one, whatever the thread count;
    the second secret's nonce wraps around 2⁹⁶ at the third chunk."""
    n = 3 * noise_module._CHUNK + 123
    wraps = bytes(range(32)) + (2**96 - 2).to_bytes(12, "big") + bytes(4)
    for secret in (wraps, bytes(range(48))):
        out = torch.zeros(n, dtype=torch.float64)
        noise_module.keystream_noise_add_(out, 1.0, secret, threads=threads)
        np.testing.assert_allclose(out.numpy(), reference_noise(secret, n), rtol=1e-12, atol=1e-12)
    # scale and accumulation: adds scale·√2·z to what is there
    again = torch.full((n,), 0.25, dtype=torch.float64)
    noise_module.keystream_noise_add_(again, 3.0, secret, threads=threads)
    np.testing.assert_allclose(again.numpy(), 0.25 + 3.0 * out.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_over_many_tensors_is_the_tensors_drawn_one_by_one(threads: int) -> None:
    """``add_`` runs the chunks of all its tensors' draws together; each tensor still gets its
    own draw, the secrets taken in the tensors' order: the same noise as one call per tensor
    (sizes below, at and above a chunk, and a non-contiguous tensor)."""
    shapes = [(7,), (noise_module._CHUNK,), (3, noise_module._CHUNK // 2 + 5), (1,), (40, 30)]

    def tensors() -> list[torch.Tensor]:
        out = [torch.full(s, 0.5) for s in shapes]
        out[-1] = out[-1].t()  # non-contiguous: drawn in float64 first, then added
        return out

    together, apart = tensors(), tensors()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        GaussianNoise(research_seed=3).add_(together, 2.0)
        one_by_one = GaussianNoise(research_seed=3)
        for t in apart:
            one_by_one.add_([t], 2.0)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(together, apart, strict=True):
        assert torch.equal(a, b)
    assert len({float(t.flatten()[0]) for t in together}) == len(shapes)  # every tensor got its own noise


def test_noise_has_no_repeated_keystream_across_chunks_or_calls() -> None:
    """A chunk reusing a counter block would repeat its noise: no value of a draw spanning many
    chunks occurs twice, nor in a second draw (float64 collisions of continuous values are
    impossible at this size)."""
    n = 24 * noise_module._CHUNK + 1
    noise = GaussianNoise()
    a, b = noise.sample((n,), 1.0, torch.float64), noise.sample((n,), 1.0, torch.float64)
    assert torch.unique(a).numel() == n
    assert torch.unique(torch.cat([a, b])).numel() == 2 * n
    # and the second draw of one object is unrelated to the first (|corr| below 6/√n)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 6 / math.sqrt(n)


def test_every_draw_takes_a_fresh_secret_from_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    """One add_ call over three tensors: three draws, each with 48 new bytes of os.urandom
    (AES-256 key + counter), none reused; and no os.urandom at all in research mode."""
    taken: list[bytes] = []
    real = noise_module.os.urandom
    monkeypatch.setattr(noise_module.os, "urandom", lambda k: taken.append(real(k)) or taken[-1])
    tensors = [torch.zeros(5), torch.zeros(3, 4), torch.zeros(2 * noise_module._CHUNK + 7)]
    GaussianNoise().add_(tensors, 1.0)
    assert [len(s) for s in taken] == [48, 48, 48] and len(set(taken)) == 3
    GaussianNoise(research_seed=1).add_(tensors, 1.0)
    assert len(taken) == 3


def test_keystream_noise_is_standard_normal() -> None:
    """10⁶ draws: Kolmogorov–Smirnov and χ² over 100 equiprobable bins against N(0, 1)."""
    from scipy import stats

    z = secure_standard_normal(1_000_000)
    assert z.shape == (1_000_000,) and z.dtype.name == "float64"
    assert stats.kstest(z, "norm").pvalue > TAIL
    counts = np.bincount(np.minimum((stats.norm.cdf(z) * 100).astype(int), 99), minlength=100)
    chi2 = float(((counts - 10_000) ** 2 / 10_000).sum())
    assert stats.chi2.ppf(TAIL, 99) < chi2 < stats.chi2.isf(TAIL, 99)


def test_adjacent_coordinates_are_independent(transform: str) -> None:
    """Coordinates j and j + 1 share Box–Muller pair j + 1 (its cosine output in j, its sine
    output in j + 1): they are independent only because the two outputs of a pair are. Fails if
    one output fed both (the sine replaced by the cosine: correlation 1/2) or a radius or angle
    were reused. 10⁶ coordinates of one draw (many chunks): the lag-1 correlations of z and of
    z² within 6 standard errors (1/√n) of 0, and a χ² over 10 × 10 equiprobable cells of the
    disjoint pairs (z_2i, z_2i+1) (99 d.o.f.), which sees any dependence of the pair's law."""
    from scipy import stats

    n = 1_000_000
    z = secure_standard_normal(n)
    for f in (z, z * z):
        assert abs(float(np.corrcoef(f[:-1], f[1:])[0, 1])) < 6 / math.sqrt(n)
    cell = np.minimum((stats.norm.cdf(z) * 10).astype(int), 9)
    counts = np.bincount(10 * cell[0::2] + cell[1::2], minlength=100)
    expected = n / 2 / 100
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert stats.chi2.ppf(TAIL, 99) < chi2 < stats.chi2.isf(TAIL, 99)


def test_noise_tails_are_gaussian_and_bounded() -> None:
    """Tail frequencies beyond 3, 4 and 5 standard deviations within binomial bounds of N(0, 1)'s,
    and the hard bound of the construction: |z| ≤ 2·√(−2 ln 2⁻⁵³)/√2 ≈ 12.1."""
    from scipy import stats

    n, std = 2_000_000, 1.5
    z = GaussianNoise().sample((n,), std, torch.float64).abs().div_(std)
    for t in (3.0, 4.0, 5.0):
        low, high = binomial_bounds(n, 2 * stats.norm.sf(t))
        assert low <= int((z > t).sum()) <= high, t
    assert float(z.max()) <= 2 * MAX_RADIUS / math.sqrt(2)


def test_noise_is_formed_in_float64_and_rounded_once(transform: str) -> None:
    """Why not the parameter's dtype: a sum of two float32 terms of size ~1 is a multiple of
    2⁻²⁴ (or coarser), so small float32 noise values would sit on that grid — the holes a
    floating-point attack tests for. Formed in float64 and rounded once, a float32 value in
    [2⁻⁸, 2⁻⁶) is a multiple of 2⁻²⁴ only if its 5–7 lowest bits are 0 (≈ 1 %). And the
    transform itself is float64: a float32 one would make every √2·z a float32 number (the
    fused multiply-add of the two terms can hide that from the grid check), while a float64
    value has at most 24 significant bits with probability ≈ 2⁻²⁹."""
    root2_z = torch.zeros(100_000, dtype=torch.float64)
    noise_module.keystream_noise_add_(root2_z, 1.0, GaussianNoise().draw_secret())
    assert int((root2_z.float().double() == root2_z).sum()) <= 5
    noise = GaussianNoise().sample((4_000_000,), math.sqrt(2), torch.float32)  # scale std/√2 = 1
    small = noise[(noise.abs() >= 2.0**-8) & (noise.abs() < 2.0**-6)].double()
    assert small.numel() > 20_000
    on_grid = float((torch.remainder(small, 2.0**-24) == 0).double().mean())
    assert on_grid < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_noise_written_into_a_buffer_is_the_draw_rounded_once(dtype: torch.dtype) -> None:
    """Research seed: noise added in place (contiguous, and a non-contiguous view) equals the
    same draw taken as a float64 sample and added in float64, then rounded to the buffer's
    dtype once; the std is right in that dtype."""
    std = 1.7
    for grad in ((torch.randn(300, 700) * 0.3).to(dtype), (torch.randn(700, 300) * 0.3).to(dtype).t()):
        before = grad.clone()
        GaussianNoise(research_seed=5).add_([grad], std)
        drawn = GaussianNoise(research_seed=5).sample(grad.shape, std, torch.float64)
        assert grad.dtype == dtype and torch.equal(grad, (before.double() + drawn).to(dtype))
    n = 1_000_000
    x = GaussianNoise().sample((n,), std, dtype).double()
    assert abs(float(x.mean())) < 6 * std / math.sqrt(n)
    # the dtype's rounding adds at most a relative 2⁻⁹ (bfloat16) to each value
    assert abs(float(x.std()) - std) < 6 * std * math.sqrt(1 / (2 * n)) + std * 2.0**-8


def test_counter_based_device_path_runs_on_cpu() -> None:
    """The non-CPU path (a per-draw torch.Generator on the tensor's device, keyed from the
    draw's secret) run on CPU: its words and the shared transform, fresh noise per secret,
    the same noise for the same secret, standard normal."""
    from scipy import stats

    assert noise_module.on_keystream(torch.device("cpu"))
    assert not noise_module.on_keystream(torch.device("cuda"))
    secret, n = bytes(range(7, 55)), 5_000
    out = torch.zeros(n, dtype=torch.float64)
    noise_module.generator_noise_add_(out, 1.0, secret)
    gen = torch.Generator().manual_seed(int.from_bytes(secret[:8], "little"))
    words = torch.empty(2 * (n + 1), dtype=torch.int64).random_(0, 2**53, generator=gen)
    np.testing.assert_allclose(out.numpy(), reference_transform(words.numpy().reshape(2, n + 1)), rtol=1e-12, atol=1e-12)
    draws = []
    for _ in range(2):
        z = torch.zeros(200_000, dtype=torch.float64)
        noise_module.generator_noise_add_(z, 1 / math.sqrt(2), GaussianNoise().draw_secret())
        draws.append(z)
    assert not torch.equal(*draws)
    assert stats.kstest(draws[0].numpy(), "norm").pvalue > TAIL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_noise_on_cuda_is_drawn_on_the_device() -> None:
    from scipy import stats

    grad = torch.zeros(1_000_000, device="cuda")
    noise = GaussianNoise()
    noise.add_([grad], 2.0)
    again = torch.zeros_like(grad)
    noise.add_([again], 2.0)
    assert grad.device.type == "cuda" and not torch.equal(grad, again)
    assert stats.kstest((grad / 2.0).double().cpu().numpy(), "norm").pvalue > TAIL
    seeded = [torch.zeros(1000, device="cuda") for _ in range(2)]
    for t in seeded:
        GaussianNoise(research_seed=3).add_([t], 1.0)
    assert torch.equal(*seeded)


# ----------------------------------------------------------------------------- config


def test_secure_rng_is_refused_with_a_helpful_message() -> None:
    with pytest.raises(ConfigError) as err:
        make_config(privacy={"secure_rng": True})
    msg = str(err.value)
    assert "privacy.secure_rng was removed" in msg and "CSPRNG" in msg and "research_noise_seed" in msg


def test_run_writes_no_noise_seed(tmp_path: Path) -> None:
    cfg = make_config(output={"dir": str(tmp_path / "run"), "progress": False})
    result = run_training(cfg, graph=GRAPH)
    run = result["run_dir"]
    resolved = yaml.safe_load((run / "config.resolved.yaml").read_text())
    assert resolved["seed"] is None and resolved["privacy"]["research_noise_seed"] is None
    assert "secure_rng" not in resolved["privacy"]
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["noise"] == "csprng-4sum" and privacy["sampling_seed"] == "fresh"
    assert privacy["delta_rule"] == DEFAULT_DELTA_RULE
    assert privacy["delta"] == default_delta(privacy["num_units"])
    dataset = privacy["dataset"]
    assert dataset["claim"].startswith("node-level DP w.r.t. the degree-capped relation set")
    assert dataset["entities"] == privacy["num_units"] and dataset["records"] == privacy["sampling_profile"]["num_records"]
    text = (run / "config.resolved.yaml").read_text() + (run / "privacy.json").read_text()
    assert "noise_seed: 0" not in text and '"research_noise_seed":' not in text


# ----------------------------------------------------------------------------- δ


@pytest.mark.parametrize(("n", "delta"), [
    (1, 1e-1), (2, 1e-2), (10, 1e-2), (11, 1e-3), (140, 1e-4), (1000, 1e-4), (1001, 1e-5),
    (1752, 1e-5), (2230, 1e-5), (10**6, 1e-7), (10**6 + 1, 1e-8),
])
def test_default_delta_rule(n: int, delta: float) -> None:
    assert default_delta(n) == delta
    assert default_delta(n) <= 1 / (10 * n)


def test_delta_module_doctests() -> None:
    # default_delta's rule, delta_too_large's edge and the shared δ ≥ 1/n warning (run and CLI)
    import doctest

    import graphveil.privacy.delta as delta_module

    result = doctest.testmod(delta_module)
    assert result.attempted >= 9 and result.failed == 0


def test_default_delta_refuses_nonsense() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            default_delta(bad)


def test_session_delta_counts_the_right_units() -> None:
    node = session()
    assert node.num_units == node.train_graph.num_nodes
    assert node.delta == default_delta(node.train_graph.num_nodes) < 1 / node.train_graph.num_nodes
    edge = session(EDGE_RUN)
    assert edge.num_units == edge.train_graph.num_edges
    assert edge.delta == default_delta(edge.train_graph.num_edges)


def test_explicit_large_delta_warns_naming_n(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="graphveil.run.session"):
        s = session(privacy={"delta": 0.05})
    assert s.delta == 0.05 and s.delta_rule == "explicit"
    assert f"n={s.num_units}" in caplog.text and "not below 1/n" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="graphveil.run.session"):
        session(privacy={"delta": 1e-6})
    assert "not below 1/n" not in caplog.text


# ----------------------------------------------------------------------------- Ē persistence


def test_records_store_fixes_the_capped_edge_set_across_sessions() -> None:
    store = MemoryRecordsStore()
    first = session(store=store, seed=1)
    assert len(store.data) == 1 and first.records_key in store.data
    again = session(store=store, seed=2)  # another sampling seed: Ē is loaded, not redrawn
    assert torch.equal(again.sampler.records, first.sampler.records)
    assert again.sampling_profile == first.sampling_profile
    assert again.privacy_report()["dataset"]["records_persisted"] is True
    # without a store, another seed draws another Ē on this graph (the issue's |Ē| drift)
    assert not torch.equal(session(seed=2).sampler.records, first.sampler.records)


def test_records_key_depends_on_graph_sampler_and_cap() -> None:
    s = session()
    key = records_key(s.train_graph, "entity_poisson_wor", {"degree_cap": 3})
    assert key == records_key(s.train_graph, "entity_poisson_wor", {"degree_cap": 3})
    assert key != records_key(s.train_graph, "entity_poisson_wor", {"degree_cap": 4})
    assert key != records_key(s.train_graph, "entity_poisson_wr", {"degree_cap": 3})
    assert key != records_key(s.test_graph, "entity_poisson_wor", {"degree_cap": 3})


def test_stored_records_that_do_not_fit_are_refused() -> None:
    store = MemoryRecordsStore()
    first = session(store=store)
    key = first.records_key
    good = store.data[key]
    train = first.train_graph
    edges = {tuple(e) for e in train.edges.tolist()}
    non_edge = next((u, v) for u in range(train.num_nodes) for v in range(u + 1, train.num_nodes)
                    if (u, v) not in edges)
    store.data[key] = torch.cat([good, torch.tensor([non_edge])])
    with pytest.raises(PrivacyError, match="is not a relation of the training graph"):
        session(store=store)
    # every edge of the graph: some degree exceeds K = 3
    store.data[key] = train.edges.clone()
    assert int(train.degrees().max()) > 3
    with pytest.raises(PrivacyError, match="degree cap K=3"):
        session(store=store)
    store.data[key] = torch.cat([good, good[:1]])
    with pytest.raises(PrivacyError, match="more than once"):
        session(store=store)


def test_edge_level_sampler_needs_no_store() -> None:
    store = MemoryRecordsStore()
    s = session(EDGE_RUN, store=store)
    assert store.data == {} and s.records_key is None
    assert torch.equal(s.sampler.records, s.train_graph.edges)


def test_file_records_store_roundtrip(tmp_path: Path) -> None:
    store = FileRecordsStore(tmp_path / "records")
    assert store.load_records("k") is None
    store.save_records("k", torch.tensor([[0, 1], [2, 3]]))
    assert torch.equal(FileRecordsStore(tmp_path / "records").load_records("k"), torch.tensor([[0, 1], [2, 3]]))
    first = session(store=store, seed=1)
    assert torch.equal(session(store=store, seed=2).sampler.records, first.sampler.records)
