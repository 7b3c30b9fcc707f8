#!/usr/bin/env python
"""Mutation check of the privacy mechanism: remove one safeguard at a time, the suite must fail.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python tests/mutation/run_mutants.py --list
    .venv/bin/python tests/mutation/run_mutants.py                       # every mutant, whole suite, -x
    .venv/bin/python tests/mutation/run_mutants.py --only clip-factors --only noise-add
    .venv/bin/python tests/mutation/run_mutants.py --tests tests/engine/test_dp_step.py --tests tests/e2e/test_private_run_e2e.py
    .venv/bin/python tests/mutation/run_mutants.py --json kill-table.json

For each mutant the runner copies the repository's tracked and untracked (not ignored) files
into a fresh temporary directory, applies the mutant there (each snippet must occur exactly
once, or the runner stops: a mutant never silently stops applying), and runs
``python -m pytest -x -q -p no:cacheprovider [TESTS]`` in the copy with this venv's python.
The package is installed editable from the original checkout; ``sitecustomize.py`` (next to
this file, put on ``PYTHONPATH``) re-points the editable finder at the copy, and a preflight
in every copy checks that ``graphveil``, its plugins, its connectors and the ``graphveil``
entry points all import from the copy. The original checkout is never written.

A baseline (the unmutated copy, same tests) runs first unless ``--no-baseline``: if it fails,
kills mean nothing and the runner stops. Exit status: 0 if every mutant was killed, 1 if any
survived or timed out, 2 on a setup error (snippet not found, baseline failing, isolation
broken). See tests/mutation/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXCLUDED_TOP = {".venv", ".git", "runs", "build", ".pytest_cache", ".ruff_cache", ".hypothesis"}


@dataclass(frozen=True)
class Mutant:
    """One removed safeguard: ``edits`` are (file, exact snippet, replacement), applied in order."""

    id: str
    removes: str
    edits: tuple[tuple[str, str, str], ...]
    note: str = ""
    tags: tuple[str, ...] = field(default=())


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "demo-setting-pick", "the relational demo's choice of the text setting for a graph with texts only",
        (("framework/graphveil/apps/demo.py",
          "    if graph.features is not None:\n        return \"cora-features\"",
          "    if True:  # MUTANT\n        return \"cora-features\""),),
    ),
    Mutant(
        "demo-setting-fit", "the refusal of a demo --setting whose encoder reads what the graph lacks",
        (("framework/graphveil/apps/demo.py",
          "        if getattr(graph, reads) is None:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "demo-node-degree-bound", "the node demo's refusal, before any row, of a graph above the rows' D",
        (("framework/graphveil/apps/demo_node.py",
          "             and unit.degree_bound is not None and unit.degree_bound < largest]",
          "             and False]  # MUTANT"),),
    ),
    Mutant(
        "demo-node-train-classes", "the node demo's refusal of a split training on fewer than two classes",
        (("framework/graphveil/apps/demo_node.py",
          "    if classes < 2:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "clip-factors", "per-tuple clipping (factors forced to 1 in the DP step)",
        (("framework/graphveil/engine/dp_step.py",
          "        factors = torch.where(bad, 0.0, factors)\n",
          "        factors = torch.where(bad, 0.0, torch.ones_like(factors))  # MUTANT: clipping removed\n"),),
    ),
    Mutant(
        "noise-add", "Gaussian noise (the noise.add_ call in the DP step)",
        (("framework/graphveil/engine/dp_step.py",
          "        noise.add_(grads, std)\n",
          "        pass  # MUTANT: noise removed\n"),),
    ),
    Mutant(
        "ddp-noise-every-rank", "noise drawn on rank 0 only in data-parallel DP steps (every rank adds it: "
        "W times the variance)",
        (("framework/graphveil/engine/dp_step.py",
          "    if group is None or group.rank == 0:\n        if noise is None:\n",
          "    if True:  # MUTANT: noise on every rank\n        if noise is None:\n"),
         ("framework/graphveil/run/session.py",
          "        if cfg.privacy.enabled and self.writes:  # data parallel: rank 0 alone draws the noise\n",
          "        if cfg.privacy.enabled:  # MUTANT: a noise source on every rank\n")),
    ),
    Mutant(
        "ddp-no-allreduce", "the all-reduce of the ranks' clipped sums (each rank steps on its shard alone)",
        (("framework/graphveil/engine/dp_step.py",
          "        group.sum_(grads)\n",
          "        pass  # MUTANT: no all-reduce\n"),),
    ),
    Mutant(
        "ddp-seed-broadcast", "rank 0's sampling seed sent to every rank (each keeps its own fresh draw)",
        (("framework/graphveil/engine/data_parallel.py",
          "        dist.broadcast(seed, src=0)\n",
          "        pass  # MUTANT: seed not broadcast\n"),),
    ),
    Mutant(
        "ddp-weights-broadcast", "rank 0's initial weights sent to every rank",
        (("framework/graphveil/engine/data_parallel.py",
          "                dist.broadcast(buffer, src=0)\n",
          "                pass  # MUTANT: weights not broadcast\n"),),
    ),
    Mutant(
        "freq-kappa", "FREQ-CLIP's κ (κ = 1, paper 1's Alg. 1 as published)",
        (("plugins/graphveil/plugins/entity_dp/clipping.py",
          "        self._kappa = 1.0 / sensitivity_bound(sampling.degree_cap, sampling.k_neg)\n",
          "        self._kappa = 1.0  # MUTANT: kappa removed\n"),),
    ),
    Mutant(
        "expected-divisor", "the expected-batch divisor b̄ (divides by the realised batch size)",
        (("framework/graphveil/engine/dp_step.py",
          "            p.grad.div_(expected_batch_size)\n",
          "            p.grad.div_(max(b, 1))  # MUTANT: realised batch size\n"),),
    ),
    Mutant(
        "wor-negatives", "NEG-SAMPLE-WOR (negatives drawn with replacement)",
        (("plugins/graphveil/plugins/entity_dp/sampler.py",
          "        drawn = sample_without_replacement(n, min(wanted, n), generator)\n",
          "        drawn = torch.randint(0, n, (min(wanted, n),), generator=generator)  # MUTANT: with replacement\n"),),
    ),
    Mutant(
        "degree-cap", "the degree cap K (the entity samplers sample from every edge)",
        (("plugins/graphveil/plugins/entity_dp/sampler.py",
          "        return cap_degrees(graph.edges, graph.num_nodes, self.params.degree_cap, generator)\n",
          "        return graph.edges  # MUTANT: degree cap removed\n"),),
    ),
    Mutant(
        "csprng", "the OS CSPRNG (noise drawn from a seeded torch generator)",
        (("framework/graphveil/engine/noise.py",
          "        self.generator: torch.Generator | None = None\n",
          "        self.generator: torch.Generator | None = torch.Generator().manual_seed(0)  # MUTANT: seeded PRNG\n"),),
        note="targets the issue-6 code (re-checked when it landed)",
        tags=("in-flux",),
    ),
    Mutant(
        "csprng-key", "the fresh OS key of each AES-CTR noise keystream (a fixed key and counter)",
        (("framework/graphveil/engine/noise.py",
          "    return os.urandom(_KEY_BYTES + _COUNTER_BYTES)\n",
          "    return bytes(_KEY_BYTES + _COUNTER_BYTES)  # MUTANT\n"),),
    ),
    Mutant(
        "noise-key-per-object", "a fresh key for every noise draw (one key drawn once per noise object, reused)",
        (("framework/graphveil/engine/noise.py",
          "            return fresh_secret()\n",
          "            return self.__dict__.setdefault(\"_secret\", fresh_secret())  # MUTANT\n"),),
    ),
    Mutant(
        "noise-chunk-counter", "the nonce of each chunk of a draw (every chunk with the draw's first nonce: the same blocks)",
        (("framework/graphveil/engine/noise.py",
          "            _chunk_encryptor(secret, start // _CHUNK).update_into(_ZEROS[: 8 * words], scratch.stream)\n",
          "            _chunk_encryptor(secret, 0).update_into(_ZEROS[: 8 * words], scratch.stream)  # MUTANT\n"),),
    ),
    Mutant(
        "noise-chunk-overlap", "the nonce's wrap mod 2^96 (a nonce past 2^96 - 1: 13 bytes, refused or cut)",
        (("framework/graphveil/engine/noise.py",
          "+ chunk) % (1 << 96)\n",
          "+ chunk)  # MUTANT\n"),),
        note="only a nonce within a draw's chunk count of 2^96 reaches it: the reference test's second secret",
    ),
    Mutant(
        "noise-4sum-one-term", "the sum of Box-Muller outputs of two different pairs (four uniforms) per coordinate (both outputs of one pair: two uniforms, same law)",
        (("framework/graphveil/engine/noise.py",
          "    torch.sin(angle[:k], out=out)  # Y_j: pair j's sine output goes to coordinate j\n",
          "    torch.sin(angle[1:], out=out)  # MUTANT\n"),
         ("framework/graphveil/engine/noise.py",
          "    out.mul_(radius[:k])\n",
          "    out.mul_(radius[1:])  # MUTANT\n")),
        note="N(0, 1) and independent either way: only the reference-keystream test sees it",
    ),
    Mutant(
        "noise-chain-sine", "the sine output of each Box-Muller pair (its cosine again: adjacent coordinates share a term)",
        (("framework/graphveil/engine/noise.py",
          "    torch.sin(angle[:k], out=out)  # Y_j: pair j's sine output goes to coordinate j\n",
          "    torch.cos(angle[:k], out=out)  # MUTANT\n"),),
        note="each coordinate still N(0, 1): the adjacent-coordinates independence test sees it (correlation 1/2)",
    ),
    Mutant(
        "noise-4sum-scale", "the 1/sqrt(2) of the two-term sum (halved instead: noise std too small)",
        (("framework/graphveil/engine/noise.py",
          "        scale = std / math.sqrt(2)  # z is formed as √2·z (module note)\n",
          "        scale = std / 2  # MUTANT\n"),),
    ),
    Mutant(
        "noise-float32-transform", "the float64 transform (formed in float32: a coarse grid near zero)",
        (("framework/graphveil/engine/noise.py",
          "        self.work = torch.empty(3 * _pairs(_CHUNK), dtype=torch.float64)\n",
          "        self.work = torch.empty(3 * _pairs(_CHUNK), dtype=torch.float32)  # MUTANT\n"),),
    ),
    Mutant(
        "noise-kernel-sine", "the fused kernel's sine output of each pair (its cosine again: adjacent coordinates share a term)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "(S[j] * U[j] + U[j + 1] * C[j + 1])",
          "(C[j] * U[j] + U[j + 1] * C[j + 1]) /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-next-pair", "the fused kernel's sum over two different pairs (both outputs of one pair: two uniforms)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "(S[j] * U[j] + U[j + 1] * C[j + 1])",
          "(S[j] * U[j] + U[j] * C[j]) /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-mask", "the fused kernel's 53-bit uniforms (the whole 64-bit word: u leaves (0, 1])",
        (("framework/graphveil/engine/_noise_kernel.c",
          "#define MASK53 ((UINT64_C(1) << 53) - 1)\n",
          "#define MASK53 (~UINT64_C(0)) /* MUTANT */\n"),),
    ),
    Mutant(
        "noise-kernel-tile-pairs", "the fused kernel's extra pair of each tile (n pairs for n coordinates: the last one's next pair is stale)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "const int64_t n = k - t < TILE ? k - t : TILE, p = n + 1;",
          "const int64_t n = k - t < TILE ? k - t : TILE, p = n; /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-octant-swap", "the fused kernel's sin/cos swap in octants 1, 2, 5, 6 (swapped in 2, 3, 6, 7)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "swap = -(((o + 1) >> 1) & 1);",
          "swap = -((o >> 1) & 1); /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-cos-sign", "the fused kernel's cosine sign (negative in octants 2-5; made that of the sine)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "^ (((o + 2) & 4) << 61);",
          "^ ((o & 4) << 61); /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-reflect", "the fused kernel's reflection 2^50 - r in odd octants (off by one: the angle moves by one step)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "(odd & (LOW50 + 2))",
          "(odd & (LOW50 + 1)) /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-sine-term", "a term of the fused kernel's sine polynomial (1/13! dropped)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "1.0 / 6227020800.0, ",
          "0.0 /* MUTANT */, "),),
    ),
    Mutant(
        "noise-kernel-log-switch", "the fused kernel's mantissa switch at sqrt(2) (never: f in [1, 2), the series too short)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "const uint64_t big = -(uint64_t)((bits & FRAC52) > SQRT2_FRAC);",
          "const uint64_t big = 0; /* MUTANT */"),),
    ),
    Mutant(
        "noise-kernel-ln2-lo", "the low part of the fused kernel's e ln 2 (dropped: 2e-10 per binade)",
        (("framework/graphveil/engine/_noise_kernel.c",
          "fma(e, LN2_HI, fma(e, LN2_LO, ln_f))",
          "fma(e, LN2_HI, ln_f) /* MUTANT */"),),
    ),
    Mutant(
        "noise-device-key", "the per-draw key of the device generator (CUDA path; a fixed seed)",
        (("framework/graphveil/engine/noise.py",
          "    generator.manual_seed(int.from_bytes(secret[:8], \"little\"))\n",
          "    generator.manual_seed(0)  # MUTANT\n"),),
    ),
    Mutant(
        "site-delta-policy", "the site's δ check on the task (a task asking another δ is refused)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "    if asked is not None and float(asked) != float(site.delta):\n",
          "    if False:  # MUTANT: task delta check removed\n"),),
        note="targets the issue-6 code (re-checked when it landed)",
        tags=("in-flux",),
    ),
    Mutant(
        "site-delta-session", "the site's re-check of the session's σ/δ against its policy (δ part)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    if sigma < site.min_noise_multiplier or delta != site.delta:  # checked on the task already\n",
          "    if sigma < site.min_noise_multiplier:  # MUTANT: delta re-check removed\n"),),
        note="targets the issue-6 code (re-checked when it landed)",
        tags=("in-flux",),
    ),
    Mutant(
        "ledger-reserve", "the ledger reservation before training (reserve only after the steps ran)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    reservation = _reserve(ledger, accountant, site, sigma=sigma, delta=delta, steps=local_steps,\n"
          "                           run=str(context.run_id), server_round=server_round)\n",
          "    reservation = None  # MUTANT: no reservation before training\n"),
         ("connectors/graphveil/connectors/flower/site.py",
          "        session.train(local_steps, schedule_start=(server_round - 1) * local_steps)\n",
          "        session.train(local_steps, schedule_start=(server_round - 1) * local_steps)\n"
          "        reservation = _reserve(ledger, accountant, site, sigma=sigma, delta=delta, steps=local_steps,  # MUTANT\n"
          "                               run=str(context.run_id), server_round=server_round)\n")),
        note="targets the issue-6 code (re-checked when it landed)",
        tags=("in-flux",),
    ),
    Mutant(
        "node-replace-sensitivity", "DP-MLP's replace-one sensitivity 2C (accounted as C)",
        (("plugins/graphveil/plugins/node_dp/accountant.py",
          "            n, b, dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity))\n",
          "            n, b, dp_accounting.GaussianDpEvent(noise_multiplier))  # MUTANT: sensitivity C\n"),),
    ),
    Mutant(
        "node-wor-sampler", "the node samplers' without-replacement batches (drawn with replacement)",
        (("plugins/graphveil/plugins/node_classification/sampler.py",
          "        return torch.randperm(self.profile.num_records, generator=generator)[: self.profile.batch_size]\n",
          "        return torch.randint(0, self.profile.num_records, (self.profile.batch_size,), generator=generator)  # MUTANT\n"),),
        note="the shared draw of node_uniform_wor, graph_splits and root_subgraphs",
    ),
    Mutant(
        "units-agree", "the whole-unit comparison of sampler, clipper, accountant and mechanisms",
        (("framework/graphveil/contract/invariant.py",
          "    if len({unit for _, unit in claimed}) > 1:\n",
          "    if False:  # MUTANT: units never compared\n"),),
    ),
    Mutant(
        "release-accounted", "accounting of one-shot releases (a mechanism's event not composed)",
        (("framework/graphveil/run/session.py",
          "                    self.accountant.compose_event(mechanism.event_at(self.noise_multiplier), stage.name)\n",
          "                    pass  # MUTANT: release not accounted\n"),),
    ),
    Mutant(
        "plan-calibration", "the plan's releases in σ calibration (σ calibrated for the steps alone)",
        (("framework/graphveil/run/session.py",
          "                    releases=self._planned_events if self.plan.releases else None,\n",
          "                    releases=None,  # MUTANT: releases not in the budget\n"),),
    ),
    Mutant(
        "shared-sigma", "a calibrated release's shared σ (the mechanism keeps no σ and adds no noise)",
        (("plugins/graphveil/plugins/node_dp/mechanisms.py",
          "        return self.noise_multiplier * self.sensitivity()\n",
          "        return 0.0  # MUTANT: calibrated release without noise\n"),),
    ),
    Mutant(
        "rr-replace-one", "randomized response analysed under replace-one (the unit's add/remove used)",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "            relation = rel.REPLACE_ONE\n",
          "            pass  # MUTANT: RR under the unit's relation\n"),),
    ),
    Mutant(
        "pure-eps-bound", "the max-divergence half of a pure-ε event's RDP (zCDP bound alone)",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "            return np.minimum(eps, grid * eps**2 / 2.0)\n",
          "            return grid * eps**2 / 2.0  # MUTANT: min dropped\n"),),
    ),
    Mutant(
        "window-feasible", "σ calibration's exact test of the window (ε within 1 % of the target accepted)",
        (("framework/graphveil/privacy/order_window.py",
          "        return self._search(sigma, planned, target, estimate=False) <= target\n",
          "        return self._search(sigma, planned, target, estimate=False) <= target * 1.01  # MUTANT\n"),),
    ),
    Mutant(
        "window-convex-bound", "the convexity bound below the window (the secant slope taken as 0: too high)",
        (("framework/graphveil/privacy/order_window.py",
          "                below = np.maximum(0.0, k0 - slope * (a[lo] - a[:lo])) / (a[:lo] - 1)\n",
          "                below = np.maximum(0.0, k0) / (a[:lo] - 1)  # MUTANT\n"),),
    ),
    Mutant(
        "window-growth", "the order window's gradual growth (it jumps to every order that might: the top of the "
        "grid, the coupled bounds' costliest)",
        (("framework/graphveil/privacy/order_window.py",
          "            hi = min(max(hi, int(might.max())), hi + grow, max(top, hi + 1))\n",
          "            hi = max(hi, int(might.max()))  # MUTANT\n"),),
    ),
    Mutant(
        "window-estimate-slack", "the window's ε estimate searched until no order outside may be lower (its "
        "smallest ε taken at once)",
        (("framework/graphveil/privacy/order_window.py",
          "                might = np.flatnonzero(bound < smallest / (1.0 + share))\n",
          "                might = np.flatnonzero(bound < 0.0 * smallest)  # MUTANT\n"),),
    ),
    Mutant(
        "window-lazy-release-bound", "the bound on a lazily computed release above the window (its value at the "
        "window's top, monotone in α) taken too high",
        (("framework/graphveil/privacy/order_window.py",
          "        out[hi + 1:] = max(0.0, top) if np.isfinite(top) else 0.0\n",
          "        out[hi + 1:] = 2.0 * max(0.0, top) + 1.0 if np.isfinite(top) else 0.0  # MUTANT\n"),),
    ),
    Mutant(
        "guided-verify", "the guided calibration's exact check of a returned σ it inferred by monotonicity",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "    if met is None:  # inferred: decide it\n        met = known.record(sigma, bool(decide(sigma)))\n",
          "    if met is None:  # MUTANT: the inferred answer trusted\n        met = True\n"),),
    ),
    Mutant(
        "guided-prediction-exact", "the guided calibration's exact decision at the predicted bracket's end "
        "(the prediction, from a rough bound, taken as if decided)",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "    if not known(hi):\n        return hi\n",
          "    if not known.record(hi, hi >= guess):  # MUTANT\n        return hi\n"),),
    ),
    Mutant(
        "planned-release-key", "a release's cached RDP keyed by its event (keyed by its name: a calibrated "
        "release's curve at an earlier σ reused)",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "                    key = repr(event)\n",
          "                    key = name  # MUTANT\n"),),
    ),
    Mutant(
        "lattice-row-offset", "the closed form's per-row column offset (every row shifted by the smallest drop)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    return kept, offset + first[:, None]\n",
          "    return kept, offset + first.min()  # MUTANT\n"),),
    ),
    Mutant(
        "lattice-prune-nats", "the closed form's column pruning margin (5 nats instead of 100)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "_PRUNE_NATS = 100.0\n",
          "_PRUNE_NATS = 5.0  # MUTANT\n"),),
    ),
    Mutant(
        "pld-exact-search", "edge_pld calibration's search on its own grid (the extrapolated coarse root returned)",
        (("plugins/graphveil/plugins/edge_dp/pld_accountant.py",
          "        sigma, _ = log_secant_search(exact_epsilon, target, lower=low, upper=sigma_rdp, rtol=rtol,\n"
          "                                     guess=guess, slope=slope)\n",
          "        sigma = guess if guess is not None else sigma_rdp  # MUTANT\n"),),
    ),
    Mutant(
        "quad-converged", "the h-vs-2h agreement test of the coupled bounds' quadrature (first step accepted)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "            pending[q[np.abs(s_h - prev) <= QUAD_RTOL * np.abs(s_h) + 1e-14 * m_h]] = False\n",
          "            pending[q] = False  # MUTANT\n"),),
    ),
    Mutant(
        "lattice-halves", "the order of the closed form's row halves run in threads (put back reversed)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    return np.concatenate(_in_threads(lambda part: _lattice_rows(alphas, part, sigma), halves), axis=1)\n",
          "    return np.concatenate(_in_threads(lambda part: _lattice_rows(alphas, part, sigma), halves)[::-1],"
          " axis=1)  # MUTANT\n"),),
    ),
    Mutant(
        "unsampled-thm3", "Thm 3's switch to the unsampled Gaussian below σ = 1/UNSAMPLED_BELOW (deleted)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    if (tiny := _unsampled_rdp(orders, sigma, 1.0)) is not None:\n        return tiny\n",
          "    pass  # MUTANT\n"),),
    ),
    Mutant(
        "unsampled-c1-mean", "Thm C.1's unsampled bound with the largest mean K instead of K + 2",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    if (tiny := _unsampled_rdp(orders, sigma, K + 2.0)) is not None:\n",
          "    if (tiny := _unsampled_rdp(orders, sigma, float(K))) is not None:  # MUTANT\n"),),
    ),
    Mutant(
        "rr-below-reject", "randomized response's integers: rejection of the incomplete last block (dropped: w mod N)",
        (("framework/graphveil/privacy/randomized_response.py",
          "    accepted = words if limit is None else words[words < limit]\n",
          "    accepted = words  # MUTANT\n"),),
    ),
    Mutant(
        "rr-default-csprng", "randomized response without a generator: a fixed numpy stream instead of the CSPRNG",
        (("framework/graphveil/privacy/randomized_response.py",
          "    draws = _Draws(None if generator is None else _numpy_rng(generator))\n",
          "    draws = _Draws(np.random.default_rng(0) if generator is None else _numpy_rng(generator))  # MUTANT\n"),),
    ),
    Mutant(
        "rr-uniform-bits", "randomized response's 53-bit uniforms (one bit short: [0, 1/2))",
        (("framework/graphveil/privacy/randomized_response.py",
          "        return (self._words(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53\n",
          "        return (self._words(n) >> np.uint64(12)).astype(np.float64) * 2.0**-53  # MUTANT\n"),),
    ),
    Mutant(
        "quad-nested", "the nested refinement of the quadrature (the coarser sum not halved)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "                s_h += prev / 2\n",
          "                s_h += prev  # MUTANT\n"),),
    ),
    Mutant(
        "quad-far-columns", "the log-space terms where φ underflows (plain φ·expm1 used: 0·inf)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    far = real & (log_phi < -700.0)\n",
          "    far = real & (log_phi < -np.inf)  # MUTANT\n"),),
    ),
    Mutant(
        "quad-padding", "the neutral padding of the coupled bounds' quadrature rows (padded points weighted φ = 1)",
        (("plugins/graphveil/plugins/entity_dp/coupled_rdp.py",
          "    log_r, log_phi = np.zeros(t.shape), np.full(t.shape, -np.inf)\n",
          "    log_r, log_phi = np.zeros(t.shape), np.zeros(t.shape)  # MUTANT\n"),),
    ),
    Mutant(
        "session-nonprivate", "the private step (a private session wired to nonprivate_step)",
        (("framework/graphveil/run/session.py",
          "        step_fn = dp_step if private else nonprivate_step\n",
          "        step_fn = nonprivate_step  # MUTANT: private run without DP\n"),),
    ),
    Mutant(
        "dpdgc-projection", "DPDGC's projection of W⁽ᴬ⁾ onto rows of norm c after every step",
        (("plugins/graphveil/plugins/gdp/dpdgc.py",
          "                 after_step=model.project)\n",
          "                 after_step=None)  # MUTANT: projection dropped\n"),),
    ),
    Mutant(
        "dpdgc-group", "DP-Emb's group of 2D + 1 changed rows at node level (the paper's D + 1 instead)",
        (("plugins/graphveil/plugins/gdp/levels.py",
          "            return 2 * self.unit.degree_bound + 1\n",
          "            return self.unit.degree_bound + 1  # MUTANT: D + 1\n"),),
    ),
    Mutant(
        "pma-sensitivity", "PMA's per-hop sensitivity 2√D at node level (√D instead)",
        (("plugins/graphveil/plugins/gdp/levels.py",
          "        return 2.0 * math.sqrt(d)\n",
          "        return math.sqrt(d)  # MUTANT: factor 2 dropped\n"),),
    ),
    Mutant(
        "pma-k-neighbor-sensitivity", "GAP's k-neighbor hop sensitivity √(4D + k(k + 4)) on the keyed cap "
        "(paper 4's 2√D, which holds inside the out-degree class only)",
        (("plugins/graphveil/plugins/gdp/levels.py",
          "            return math.sqrt(4 * d + self.unit.k * (self.unit.k + 4))\n",
          "            return 2.0 * math.sqrt(d)  # MUTANT: the in-class bound on the raw graph\n"),),
    ),
    Mutant(
        "node-degree-class-check", "node level's refusal of a graph whose out-degree exceeds D",
        (("plugins/graphveil/plugins/gdp/common.py",
          "    if bound is None or largest <= bound:\n",
          "    if True:  # MUTANT: any graph accepted at node level\n"),),
    ),
    Mutant(
        "node-degree-class-at-bind", "the node-level degree check when the data is loaded (before any stage)",
        (("plugins/graphveil/plugins/gdp/common.py",
          "        check_out_degree_class(task, self.level)\n        self.train_nodes = task.split.train\n",
          "        self.train_nodes = task.split.train  # MUTANT: checked only when edges are read\n"),),
    ),
    Mutant(
        "node-level-cap", "node level reads the raw graph (a keyed cap applied at node level instead, "
        "the pre-issue-25 path)",
        (("plugins/graphveil/plugins/gdp/levels.py",
          "        if not caps or self.unit is None or self.unit.kind is not UnitKind.K_NEIGHBOR:\n",
          "        if not caps or self.unit is None or self.edge_level:  # MUTANT: node level capped too\n"),
         ("plugins/graphveil/plugins/gdp/common.py",
          "    if bound is None or largest <= bound:\n",
          "    if True:  # MUTANT: any graph accepted at node level\n")),
    ),
    Mutant(
        "cap-order-by-position", "the keyed edge order of the out-degree cap (each column's position instead: "
        "data-dependent)",
        (("framework/graphveil/transforms.py",
          "        order = np.lexsort((dst, edge_priorities(edge_index, self.key), src))\n",
          "        order = np.lexsort((np.arange(src.size), src))  # MUTANT: input order\n"),),
    ),
    Mutant(
        "cap-key-from-seed", "the per-run secret key of GAP's k-neighbor cap (a fixed key instead)",
        (("framework/graphveil/transforms.py",
          "        self.key = secrets.token_bytes(EDGE_KEY_BYTES) if key is None else key\n",
          "        self.key = bytes(EDGE_KEY_BYTES) if key is None else key  # MUTANT: fixed key\n"),),
    ),
    Mutant(
        "gap-pma-std-halved", "GAP's per-hop aggregation noise std σ·Δ (σ·Δ/2 added, σ accounted)",
        (("plugins/graphveil/plugins/gdp/gap.py",
          "        std = self.sigma() * self.sensitivity() if self.level.private else 0.0\n",
          "        std = self.sigma() * self.sensitivity() / 2 if self.level.private else 0.0  # MUTANT\n"),),
    ),
    Mutant(
        "dpdgc-z-noise-halved", "DPDGC's noise on Z, std σ·noise_scale·Δ_Z (half of it added)",
        (("plugins/graphveil/plugins/gdp/dpdgc.py",
          "                noise.add_([z], self.sigma() * self.sensitivity())\n",
          "                noise.add_([z], self.sigma() * self.sensitivity() / 2)  # MUTANT\n"),),
    ),
    Mutant(
        "dpemb-unscaled-sigma", "DP-Emb trained at σ·noise_scale (trained at the run's σ, accounted at σ·noise_scale)",
        (("plugins/graphveil/plugins/gdp/dpdgc.py",
          "                 noise_multiplier=self.sigma(), noise=noise, generator=self.generator,\n",
          "                 noise_multiplier=GdpRelease.sigma(self), noise=noise, generator=self.generator,  # MUTANT\n"),),
    ),
    Mutant(
        "rand-edge-epsilon", "RandEdge's flip probability at the accounted ε (the pairs flipped at 2ε)",
        (("plugins/graphveil/plugins/gdp/rand_edge.py",
          "        noisy = randomized_response_edges(pairs, data.num_nodes, self.epsilon, self.generator)\n",
          "        noisy = randomized_response_edges(pairs, data.num_nodes, 2 * self.epsilon, self.generator)  # MUTANT\n"),),
    ),
    Mutant(
        "rr-baseline-epsilon", "paper 2's RR baseline flips relations at the accounted ε (flipped at 2ε)",
        (("plugins/graphveil/plugins/edge_dp/rr_baseline.py",
          "        noisy = randomized_response_edges(graph.edges.T.contiguous(), graph.num_nodes, self.epsilon,\n",
          "        noisy = randomized_response_edges(graph.edges.T.contiguous(), graph.num_nodes, 2 * self.epsilon,  # MUTANT\n"),),
    ),
    Mutant(
        "pure-basic-composition", "basic composition of pure-ε releases (the largest ε instead of the sum)",
        (("framework/graphveil/privacy/rdp_accountant.py",
          "        return float(sum(self._pure))\n",
          "        return float(max(self._pure))  # MUTANT: max instead of sum\n"),),
    ),
    Mutant(
        "node-rdp-structures", "node_rdp's restriction to row-wise models (a neighbour-reading model accepted)",
        (("plugins/graphveil/plugins/node_dp/accountant.py",
          "    structures: ClassVar[frozenset[ExampleStructure]] = frozenset({ExampleStructure.ROWS})\n",
          "    structures = None  # MUTANT: any model structure\n"),),
    ),
    Mutant(
        "rooted-group", "DP-SAGE's count of changed rooted examples 2·N_L − 1 (N_L, one graph only, instead)",
        (("plugins/graphveil/plugins/gdp/rooted.py",
          "    return 2 * reached_roots(degree_bound, hops) - 1\n",
          "    return reached_roots(degree_bound, hops)  # MUTANT: before-graph only\n"),),
    ),
    Mutant(
        "rooted-sensitivity", "the 2C per changed rooted example under replacement (C instead)",
        (("plugins/graphveil/plugins/gdp/rooted_accountant.py",
          "REPLACEMENT_SENSITIVITY = 2.0\n",
          "REPLACEMENT_SENSITIVITY = 1.0  # MUTANT: add/remove sensitivity\n"),),
    ),
    Mutant(
        "rooted-hypergeometric", "the hypergeometric count of changed examples (one per batch instead)",
        (("plugins/graphveil/plugins/gdp/rooted_accountant.py",
          "    changed = min(group, n)\n",
          "    changed = 1  # MUTANT: one changed example\n"),),
    ),
    Mutant(
        "rooted-node-rdp-guard", "node_rdp's refusal of samplers whose examples share nodes",
        (("plugins/graphveil/plugins/node_dp/accountant.py",
          "        if sampling.examples_per_unit != 1:\n",
          "        if False:  # MUTANT: shared examples accepted\n"),),
    ),
    Mutant(
        "sage-output-clip", "DP-SAGE's clipping of every node's scores to norm c before the noise",
        (("plugins/graphveil/plugins/gdp/dp_sage.py",
          "        scores = scores * (c / scores.norm(dim=1, keepdim=True).clamp(min=c))\n",
          "        scores = scores  # MUTANT: no clipping\n"),),
    ),
    Mutant(
        "sage-output-sensitivity", "DP-SAGE's output sensitivity 2c·√G (2c, one node's row, instead)",
        (("plugins/graphveil/plugins/gdp/dp_sage.py",
          "        return 2.0 * self.params.output_clip * math.sqrt(changed_examples(self.level.unit.degree_bound, self.hops))\n",
          "        return 2.0 * self.params.output_clip  # MUTANT: one row\n"),),
    ),
    Mutant(
        "release-view-guard", "the refusal of a DP-SGD stage whose sampler would be bound to a release after calibration",
        (("framework/graphveil/run/session.py",
          "        if self.trains_privately:\n            raise ConfigError(f\"task {self.config.task.name!r} trains on a release",
          "        if False:  # MUTANT\n            raise ConfigError(f\"task {self.config.task.name!r} trains on a release"),),
    ),
    Mutant(
        "few-shot-restore", "putting the released weights back after few-shot fine-tuning (a run would "
        "save and a site share the few-shot model)",
        (("plugins/graphveil/plugins/relational/few_shot.py",
          "    finally:\n        model.load_trainable_state(released)\n",
          "    finally:\n        pass  # MUTANT\n"),),
    ),
    Mutant(
        "pld-sensitivity", "edge_pld's per-step sensitivity C (C/2 instead)",
        (("plugins/graphveil/plugins/edge_dp/pld_accountant.py",
          "                sigma, sensitivity=1.0, sampling_prob=self._rate, pessimistic_estimate=True,\n",
          "                sigma, sensitivity=0.5, sampling_prob=self._rate, pessimistic_estimate=True,  # MUTANT\n"),),
    ),
    Mutant(
        "pld-incremental", "edge_pld composing every step added to a cached history (one instead)",
        (("plugins/graphveil/plugins/edge_dp/pld_accountant.py",
          "            extra = steps - done.get(sigma, 0)\n",
          "            extra = min(1, steps - done.get(sigma, 0))  # MUTANT: one step\n"),),
    ),
    Mutant(
        "pld-calibrate-check", "edge_pld calibration's exact check that a returned σ meets the target "
        "(1 % above the target accepted)",
        (("plugins/graphveil/plugins/edge_dp/sigma_search.py",
          "        if eps <= target:  # the check every returned σ but ``upper`` passed\n",
          "        if eps <= 1.01 * target:  # MUTANT\n"),),
    ),
    Mutant(
        "pld-calibrate-exact-grid", "edge_pld calibration's final search on the accountant's own grid "
        "(the coarse grid's σ returned)",
        (("plugins/graphveil/plugins/edge_dp/pld_accountant.py",
          "            return float(self._pld(with_steps(sigma)).get_epsilon_for_delta(delta))\n",
          "            return coarse_epsilon(sigma)  # MUTANT\n"),),
    ),
    Mutant(
        "pld-calibrate-tolerance", "edge_pld calibration's bracket closed to 1 + rtol (10 × wider)",
        (("plugins/graphveil/plugins/edge_dp/sigma_search.py",
          "    while hi - lo > width:\n",
          "    while hi - lo > 10 * width:  # MUTANT\n"),),
    ),
    Mutant(
        "audit-delta-term", "the one-run audit's δ term 2mδ·α (the bound as if δ = 0)",
        (("framework/graphveil/privacy/one_run_audit.py",
          "    return min(tail + 2.0 * m * delta * alpha, 1.0)\n",
          "    return min(tail, 1.0)  # MUTANT\n"),),
    ),
    Mutant(
        "audit-delta-factor", "the factor 2 of the one-run audit's δ term (mδ·α)",
        (("framework/graphveil/privacy/one_run_audit.py",
          "    return min(tail + 2.0 * m * delta * alpha, 1.0)\n",
          "    return min(tail + m * delta * alpha, 1.0)  # MUTANT\n"),),
    ),
    Mutant(
        "audit-alpha-max", "the max over window widths i in the audit's δ term (only i = v)",
        (("framework/graphveil/privacy/one_run_audit.py",
          "    alpha = float(np.max(windows / i))\n",
          "    alpha = float(windows[-1] / v)  # MUTANT\n"),),
    ),
    Mutant(
        "audit-tail", "the audit's binomial tail P[W ≥ v] (P[W > v] instead)",
        (("framework/graphveil/privacy/one_run_audit.py",
          "    tail = float(stats.binom.sf(v - 1, r, q))  # P[W̃ ≥ v]\n",
          "    tail = float(stats.binom.sf(v, r, q))  # MUTANT\n"),),
    ),
    Mutant(
        "audit-bonferroni", "the Bonferroni level of the audit's guess-count grid (each r at the full level)",
        (("framework/graphveil/apps/audit.py",
          "    level = (1.0 - confidence) / len(grid)\n",
          "    level = 1.0 - confidence  # MUTANT\n"),),
    ),
    Mutant(
        "audit-canary-membership", "leaving out a canary's relations when it is drawn out (all canaries in)",
        (("framework/graphveil/apps/audit.py",
          "        if bool(included[i]):\n",
          "        if True:  # MUTANT\n"),),
    ),
    Mutant(
        "audit-canary-entity", "removing a left-out entity canary itself (only its relations go)",
        (("framework/graphveil/apps/audit.py",
          "    present = [not (node_level and j == 0 and not bool(included[i])) for i in range(m) for j in range(per)]\n",
          "    present = [True for i in range(m) for j in range(per)]  # MUTANT\n"),),
    ),
    Mutant(
        "report-claim-check", "graphveil report's check that a run's accountant reproduces its claimed ε",
        (("framework/graphveil/apps/report_accounting.py",
          "        if not math.isclose(again, claimed, rel_tol=MATCH_RTOL, abs_tol=1e-12):\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "report-run-sigma", "graphveil report re-accounting a graph-method run at its own σ (1 % off)",
        (("framework/graphveil/apps/report_accounting.py",
          '                          "noise_multiplier": None if target_epsilon is not None else self.sigma,\n',
          '                          "noise_multiplier": None if target_epsilon is not None else self.sigma * 1.01,\n'),),
    ),
    Mutant(
        "report-profile-steps", "graphveil report's t steps on a relational run's recorded profile (one)",
        (("framework/graphveil/apps/report_accounting.py",
          "        accountant.step(noise_multiplier=self.sigma, num_steps=steps)\n",
          "        accountant.step(noise_multiplier=self.sigma, num_steps=1)  # MUTANT\n"),),
    ),
    Mutant(
        "run-name-check", "the refusal of a run name that is not one folder name (--set name=../../../x "
        "writes outside runs/)",
        (("framework/graphveil/run/config.py", "        return check_run_name(v)\n", "        return v  # MUTANT\n"),),
    ),
    Mutant(
        "sweep-resume-config", "the refusal to resume a sweep cell run with another config",
        (("framework/graphveil/run/runner.py",
          "    if saved != wanted:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "data-options-at-assemble", "the check of the data source's options when the run is assembled (the "
        "config checks only the shape: a bad data.* option would be found only once the data is read)",
        (("framework/graphveil/run/session.py",
          "        self.data_options = assembled_data_options(cfg, self.host, reads_data=self.graph is None)\n",
          "        self.data_options = None  # MUTANT\n"),),
    ),
    Mutant(
        "sweep-data-before-folder", "a sweep's refusal of a bad data option before its folder opens (graphveil "
        "sweep would leave an empty .partial folder to resume)",
        (("framework/graphveil/run/runner.py",
          "    data_options = assembled_data_options(config, host, reads_data=graph is None)\n",
          "    data_options = None  # MUTANT\n"),),
    ),
    Mutant(
        "gateway-body-limit", "the Fleet gateway's refusal of a declared body over the limit (a 400 MB "
        "unauthenticated POST was read and forwarded)",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "        if declared is not None and declared > self.limits.max_body:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "gateway-chunked-limit", "the Fleet gateway's count of a chunked body against the limit",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "                    if len(body) + len(event.data) > self.limits.max_body:  # a chunked body\n",
          "                    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "gateway-header-timeout", "the Fleet gateway's header timeout (a half-open connection stays open)",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "                    async with asyncio.timeout(self.limits.header_timeout):\n"
          "                        request = await self._event(conn, reader)\n",
          "                    async with asyncio.timeout(None):  # MUTANT\n"
          "                        request = await self._event(conn, reader)\n"),
         ("connectors/graphveil/connectors/flower/gateway.py",
          "                async with asyncio.timeout(self.limits.header_timeout):\n"
          "                    transport = await loop.start_tls(",
          "                async with asyncio.timeout(None):  # MUTANT\n"
          "                    transport = await loop.start_tls("),
         ("connectors/graphveil/connectors/flower/gateway.py",
          "ssl_handshake_timeout=self.limits.header_timeout)\n", "ssl_handshake_timeout=None)  # MUTANT\n")),
    ),
    Mutant(
        "gateway-body-timeout", "the Fleet gateway's body timeout (a body sent a byte at a time holds the "
        "connection)",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "            async with asyncio.timeout(self.limits.body_timeout):\n",
          "            async with asyncio.timeout(None):  # MUTANT\n"),),
    ),
    Mutant(
        "gateway-connection-cap", "the Fleet gateway's connection cap",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "        if self.stats.active >= self.limits.max_connections:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "gateway-buffer-budget", "the Fleet gateway's bound on bodies held at once over all connections",
        (("connectors/graphveil/connectors/flower/gateway.py",
          "        if self.stats.reserved + reserve > self.limits.max_buffered:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "sql-url-password", "the refusal of a database URL holding a password (it would reach "
        "config.resolved.yaml and the logs)",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          "    if parsed.password is not None or secrets:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "sql-redact", "the password's removal from URLs in messages and logs",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          "    return url._replace(password=None).update_query_dict(hidden).render_as_string()\n",
          "    return url.render_as_string(hide_password=False)  # MUTANT\n"),),
    ),
    Mutant(
        "sql-scrub", "scrubbing the password from database error messages",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          '    return message.replace(password, "***") if password else message\n',
          "    return message  # MUTANT\n"),),
    ),
    Mutant(
        "sql-write-words", "the refusal of a query with a clause that writes (WITH … DELETE, SELECT … INTO)",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          "    writes = [node for node in statement.walk() if isinstance(node, kinds)]\n",
          "    writes = []  # MUTANT\n"),),
    ),
    Mutant(
        "sql-one-statement", "the one-statement check (only the first statement of a query is checked)",
        (("plugins/graphveil/plugins/standard/sources/sql.py", "    if len(statements) > 1:\n", "    if False:  # MUTANT\n"),
         ("plugins/graphveil/plugins/standard/sources/sql.py", "    (statement,) = statements\n", "    statement = statements[0]  # MUTANT\n")),
    ),
    Mutant(
        "sql-dialect", "parsing a query in its database's dialect (sqlglot's generic SQL splits quotes "
        "otherwise than PostgreSQL or SQLite)",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          "        parsed = sqlglot.parse(sql, dialect=dialect)\n",
          "        parsed = sqlglot.parse(sql, dialect=None)  # MUTANT\n"),),
    ),
    Mutant(
        "duckdb-external-access", "DuckDB's external access off (a query reads /etc/passwd, files and URLs)",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          'DUCKDB_CONFIG = {"enable_external_access": False,',
          'DUCKDB_CONFIG = {"enable_external_access": True,  # MUTANT\n'
          '                 '),),
    ),
    Mutant(
        "duckdb-config", "DuckDB's locked configuration (external access, extension install and load)",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          '        connect_args["config"] = dict(DUCKDB_CONFIG)\n',
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "sql-readonly-postgres", "PostgreSQL's read-only transaction",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          "                conn = conn.execution_options(postgresql_readonly=True)\n",
          "                pass  # MUTANT\n"),),
    ),
    Mutant(
        "sql-readonly-sqlite", "SQLite's query_only connection",
        (("plugins/graphveil/plugins/standard/sources/sql.py",
          '        sa.event.listen(engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA query_only = ON"))\n',
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "mlflow-secret-keys", "the MLflow plugin's redaction of values under secret-looking keys",
        (("plugins/graphveil/plugins/mlflow_tracking/redact.py",
          "    if key and value is not None and is_secret_key(key):\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "mlflow-url-passwords", "the masking of a URL's password (MLflow params, database URLs in messages)",
        (("framework/graphveil/redaction.py", "    if end >= 0:\n", "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "redact-password-separators", "a URL password holding '@' or '/' masked up to the URL's last '@' "
        "(bob:p@ss/w0rd@db showed @ss/w0rd)",
        (("framework/graphveil/redaction.py",
          '    return rest.rfind("@") if has_password else -1\n',
          '    return rest.find("@") if has_password else -1  # MUTANT\n'),),
    ),
    Mutant(
        "redact-url-query", "the masking of secret URL query parameters (?password=, ?sslpassword=, ?token=)",
        (("framework/graphveil/redaction.py",
          '    return f"{key}={REDACTED}" if eq and is_secret_key(unquote_plus(key)) else piece\n',
          "    return piece  # MUTANT\n"),),
    ),
    Mutant(
        "redact-libpq", "the masking of secret pairs of a libpq connection string (host=db password=…)",
        (("framework/graphveil/redaction.py",
          '    return KEY_VALUE.sub(lambda m: f"{m[\'key\']}{m[\'eq\']}{REDACTED}" if is_secret_key(m["key"]) else m[0], text)\n',
          "    return text  # MUTANT\n"),),
    ),
    Mutant(
        "mlflow-guard", "the MLflow plugin's guard: a tracking error must not fail the run",
        (("plugins/graphveil/plugins/mlflow_tracking/__init__.py",
          "        except Exception as exc:  # an observer must not fail the run it observes\n",
          "        except ImportError as exc:  # MUTANT\n"),),
    ),
    Mutant(
        "scaffold-clip-threshold", "`graphveil plugin new`'s clipper clipping at C (2C instead)",
        (("framework/graphveil/apps/plugin_template/clipper.py.tmpl",
          "        return self.clip_norm\n",
          "        return 2 * self.clip_norm  # MUTANT\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "scaffold-accountant-rdp", "`graphveil plugin new`'s accountant analysing the step's σ (2σ instead)",
        (("framework/graphveil/apps/plugin_template/accountant.py.tmpl",
          "        return np.asarray(compute_rdp(q=self.rate, noise_multiplier=noise_multiplier, steps=1,\n",
          "        return np.asarray(compute_rdp(q=self.rate, noise_multiplier=2 * noise_multiplier, steps=1,  # MUTANT\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "scaffold-sampler-wor", "`graphveil plugin new`'s sampler: uniform draw without replacement (with replacement)",
        (("framework/graphveil/apps/plugin_template/sampler.py.tmpl",
          "        return NodeBatch(torch.randperm(n, generator=generator)[:b])  # a uniform b-subset\n",
          "        return NodeBatch(torch.randint(0, n, (b,), generator=generator))  # MUTANT: with replacement\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "scaffold-mechanism-clip", "`graphveil plugin new`'s mechanism: row clipping before the sum",
        (("framework/graphveil/apps/plugin_template/mechanism.py.tmpl",
          "        clipped = rows * (self.ROW_NORM / rows.norm(dim=1, keepdim=True).clamp_min(self.ROW_NORM))\n",
          "        clipped = rows  # MUTANT: rows not clipped\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "scaffold-mechanism-noise", "`graphveil plugin new`'s mechanism: noise std s (s/2 added, s accounted)",
        (("framework/graphveil/apps/plugin_template/mechanism.py.tmpl",
          "        noise.add_([total], self.params.noise_std)\n",
          "        noise.add_([total], self.params.noise_std / 2)  # MUTANT: half the noise\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "scaffold-mechanism-event", "`graphveil plugin new`'s mechanism: noise multiplier s / sensitivity (s accounted)",
        (("framework/graphveil/apps/plugin_template/mechanism.py.tmpl",
          "        return dp_accounting.GaussianDpEvent(self.params.noise_std / self.sensitivity())\n",
          "        return dp_accounting.GaussianDpEvent(self.params.noise_std)  # MUTANT: sensitivity ignored\n"),),
        note="killed by the generated package's own test, run by tests/apps/test_plugin_new.py (slow)",
    ),
    Mutant(
        "frozen-head-identity", "frozen_head's identity start (the base row is the frozen model)",
        (("plugins/graphveil/plugins/hf_lora/frozen_head.py",
          "                    self.linear.weight.copy_(torch.eye(dim))\n",
          "                    pass  # MUTANT\n"),),
    ),
    Mutant(
        "frozen-head-row-mixing", "frozen_head keeping each example's rows apart (per-tuple gradients)",
        (("plugins/graphveil/plugins/hf_lora/frozen_head.py",
          "        return self.head(self._x[ids].to(self.device))\n",
          "        x = self._x[ids].to(self.device)\n"
          "        return self.head(x + 0.1 * x.mean(0, keepdim=True))  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-key-data", "the site's data (token ids) in the prepared cache's key (a stale hit on changed texts)",
        (("plugins/graphveil/plugins/hf_common.py",
          "            _hash_tensor(h, f\"input:{name}\", inputs[name])\n",
          "            pass  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-key-weights", "the frozen weights in the prepared cache's key (a stale hit on another model)",
        (("plugins/graphveil/plugins/hf_common.py",
          "        _hash_tensor(h, f\"weight:{name}\", tensor)\n",
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-key-texts", "the texts in the prepared cache's key (a stale hit on another graph)",
        (("plugins/graphveil/plugins/hf_common.py",
          "        _hash_texts(h, texts)\n",
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-key-tokenizer", "the tokenizer's fingerprint in the prepared cache's key (a stale hit on "
        "another tokenizer)",
        (("plugins/graphveil/plugins/hf_common.py",
          "        h.update(fingerprint)\n",
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "secret-suffix", "secret names that end in a secret word (libpq's sslpassword)",
        (("framework/graphveil/redaction.py",
          "    return word in SECRET_WORDS or word.endswith(SECRET_SUFFIXES)\n",
          "    return word in SECRET_WORDS  # MUTANT\n"),),
    ),
    Mutant(
        "secret-file-suffix", "secret names of a password file (passwordfile, PGPASSFILE)",
        (("framework/graphveil/redaction.py",
          "        word = word.removesuffix(FILE_SUFFIX)  # where a secret is kept: passwordfile, pgpassfile\n",
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-checksum", "the prepared cache file's checksum (a corrupt file is used)",
        (("framework/graphveil/run/prepared_cache.py",
          "        if not hmac.compare_digest(self._digest(key, payload).encode(\"ascii\"), digest):\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-file-key", "the key in a prepared cache file's HMAC (another key's file is used)",
        (("framework/graphveil/run/prepared_cache.py",
          "        return keyed_digest(self._site_key, key.encode(\"utf-8\"), payload)\n",
          "        return keyed_digest(self._site_key, payload)  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-site-key", "the site key in the prepared cache's checksum (a file rewritten in place with "
        "its plain SHA-256 recomputed loads as a hit)",
        (("framework/graphveil/run/prepared_cache.py",
          "        return keyed_digest(self._site_key, key.encode(\"utf-8\"), payload)\n",
          "        return hashlib.sha256(payload).hexdigest()  # MUTANT\n"),),
    ),
    Mutant(
        "prepared-states-check", "the check of loaded frozen states (non-finite or misshapen states are used)",
        (("plugins/graphveil/plugins/hf_common.py",
          "            if not bool(torch.isfinite(hidden).all()):\n",
          "            if False:  # MUTANT\n"),),
    ),
    Mutant(
        "bootstrap-replacement", "resampling held-out relations WITH replacement in bootstrap intervals",
        (("framework/graphveil/evaluation.py",
          "            idx = torch.randint(0, m, (count, m), generator=gen)\n",
          "            idx = torch.stack([torch.randperm(m, generator=gen) for _ in range(count)])  # MUTANT\n"),),
    ),
    Mutant(
        "bootstrap-pairing", "pairing a row's and the base's ranks relation by relation (paired Δ)",
        (("framework/graphveil/evaluation.py",
          "    d_rr = 1.0 / ranks.double() - 1.0 / base_ranks.double()\n",
          "    d_rr = 1.0 / ranks.double() - 1.0 / base_ranks.double().flip(0)  # MUTANT\n"),),
    ),
    Mutant(
        "forkserver-reseed-numpy", "a forked ClientApp reseeds numpy's global generator",
        (("connectors/graphveil/connectors/flower/guard.py", "    np.random.seed()\n", "    pass  # MUTANT\n"),),
    ),
    Mutant(
        "forkserver-reseed-torch", "a forked ClientApp reseeds torch's default generator",
        (("connectors/graphveil/connectors/flower/guard.py", "    torch.seed()\n", "    pass  # MUTANT\n"),),
    ),
    Mutant(
        "forkserver-fork-per-task", "the fork server runs each task in a child of its own (not itself)",
        (("connectors/graphveil/connectors/flower/guard.py",
          "            pid = os.fork()\n",
          "            pid = 0  # MUTANT: the server itself runs the task\n"),),
    ),
    # ---------------------------------------------------------------- issue 25: side channels
    Mutant(
        "dp-nonfinite-resum", "the clipped sum over finite examples only (a NaN example poisons the step)",
        (("framework/graphveil/engine/dp_step.py",
          "            if bool(bad[start:stop].any()):\n"
          "                _resum_finite(engine, encoder, mine, loss, factors[start:stop], bad[start:stop], micro_batch_size)\n",
          "            pass  # MUTANT: non-finite examples stay in the sum\n"),),
    ),
    Mutant(
        "dp-nonfinite-factor", "the zero factor of a non-finite example (clipper sees its NaN norm)",
        (("framework/graphveil/engine/dp_step.py",
          "        factors = torch.as_tensor(clipper.factors(batch, torch.where(bad, 0.0, norms.detach())),\n",
          "        factors = torch.as_tensor(clipper.factors(batch, norms.detach()),  # MUTANT\n"),),
    ),
    Mutant(
        "site-failure-status", "the trained reply after the reservation (a failure says 'failed')",
        (("connectors/graphveil/connectors/flower/site.py",
          "        return records.trained_content(site.site_name, incoming, metrics,\n",
          "        return records.refused_content(site.site_name, records.FAILED, 'failed', {},  # MUTANT\n"),),
    ),
    Mutant(
        "size-floor-accounted", "the public floor in the accounted rate (γ = b/m of the private size)",
        (("framework/graphveil/sampling.py",
          "            accounted_m, self._rate = floor, b / max(m, floor)\n",
          "            accounted_m, self._rate = max(m, 1), b / max(m, floor)  # MUTANT: private m accounted\n"),),
    ),
    Mutant(
        "size-floor-sampled", "the floor in the sampling rate (sampled at b/m, above the stated b/m₀)",
        (("framework/graphveil/sampling.py",
          "            accounted_m, self._rate = floor, b / max(m, floor)\n",
          "            accounted_m, self._rate = floor, min(1.0, b / max(m, 1))  # MUTANT: rate above the stated one\n"),),
    ),
    Mutant(
        "site-public-reserve", "the reservation before the graph is read (prepare first at edge level)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    public = session.bind_public_accounting()\n",
          "    public = False  # MUTANT: the graph is read before the reservation\n"),),
    ),
    Mutant(
        "site-sampler-keys", "the site's own min-records / degree-cap in the run config",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        sampler.update(site_sampler_keys(site))\n",
          "        pass  # MUTANT: the task's sampler options stand\n"),),
    ),
    Mutant(
        "policy-sampler-keys", "the refusal of a task that sets min_records / degree_cap",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if asked is not None and asked != value:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-numerics", "the refusal of a task that changes encoder.normalize",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if value is not None and value != default and pinned.get(key) != value:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-pins", "the refusal of a task that contradicts the site-config",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if key in pinned and pinned[key] != value:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-clip-range", "the site's clip norm range",
        (("connectors/graphveil/connectors/flower/settings.py",
          "    if clip is not None and not site.min_clip_norm <= clip <= site.max_clip_norm:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-max-abs-weight", "the site's bound on the magnitude of the server's array values",
        (("connectors/graphveil/connectors/flower/site.py",
          "        if value.numel() and float(value.abs().max()) > max_abs:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-local-steps", "the lower end of the local-steps check (0 steps accepted)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "    if not 1 <= local_steps <= site.max_steps_per_round:\n",
          "    if not local_steps <= site.max_steps_per_round:  # MUTANT\n"),),
    ),
    Mutant(
        "ledger-one-records", "one record set Ē per ledger (a second key is stored)",
        (("framework/graphveil/ledger/ledger.py",
          "            if scan.records:  # one ledger, one dataset, one Ē: a second would be another guarantee\n",
          "            if False:  # MUTANT\n"),),
    ),
    # issue 25, point 6: the ledger survives its own operator
    Mutant(
        "ledger-hmac", "the site key in the ledger's row hash (plain SHA-256: anyone can re-chain a rewrite)",
        (("framework/graphveil/ledger/chain.py",
          '    return keyed_digest(key, b"graphveil-ledger-row-v3", _canonical(_normalize(row)).encode())\n',
          "    return _sha(_canonical(_normalize(row)))  # MUTANT: the key dropped\n"),),
    ),
    Mutant(
        "ledger-anchor-implicit", "the refusal of a missing anchor on open (the anchor re-made on first use)",
        (("framework/graphveil/ledger/ledger.py",
          "            if self.anchor is not None and not self.anchor.exists():\n                raise LedgerError(\n",
          "            if self.anchor is not None and not self.anchor.exists():\n"
          "                self._write_anchor(create=True)  # MUTANT: anchored at the current head\n"
          "            if False:\n                raise LedgerError(\n"),),
    ),
    Mutant(
        "ledger-verify-witnessed", "budget verify's check that the chain holds every witnessed (seq, head)",
        (("framework/graphveil/ledger/ledger.py",
          "            error = _witnessed_problem([self.genesis(), *scan.checkpoints], witnessed)\n",
          "            error = None  # MUTANT: witnessed heads ignored\n"),),
    ),
    Mutant(
        "ledger-seq-all-rows", "the witness sequence number counting checkpoint rows only (every row: "
        "the data-dependent raise/records rows reach the server)",
        (("framework/graphveil/ledger/entries.py",
          'CHECKPOINTS = ("release", "withhold", "refuse")\n',
          "CHECKPOINTS = KINDS  # MUTANT: every row is a checkpoint\n"),),
    ),
    Mutant(
        "witness-backwards", "the witness's rule that a site's sequence number never decreases",
        (("framework/graphveil/ledger/witness.py",
          "    if seq < state.last:\n",
          "    if False:  # MUTANT: backwards accepted\n"),),
    ),
    Mutant(
        "witness-fork", "the witness's rule of one head per witnessed sequence number",
        (("framework/graphveil/ledger/witness.py",
          "    return _fork(site, state, seq, head)\n",
          "    return None  # MUTANT: a fork at a witnessed seq accepted\n"),),
    ),
    Mutant(
        "witness-fork-previous", "the witness's check of a reply's previous head against the one it saw",
        (("framework/graphveil/ledger/witness.py",
          "            problem = _fork(site, state, seq - 1, previous)\n",
          "            problem = None  # MUTANT: the previous head not checked\n"),),
    ),
    Mutant(
        "witness-sticky", "the witness keeping a flagged site refused until its operator clears it",
        (("framework/graphveil/ledger/witness.py",
          "        if state.flagged is not None:\n            return (",
          "        if False:  # MUTANT: a flag does not stick\n            return ("),),
    ),
    Mutant(
        "policy-task-kind", "a node-classification site's refusal of a relational task (and the reverse)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "    _check_task_kind(site, config, host, where)\n",
          "    pass  # MUTANT: any task kind\n"),),
    ),
    Mutant(
        "policy-gdp-another-unit", "the refusal of a task unit with add/remove adjacency or weights only",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if theirs.adjacency is not Adjacency.REPLACEMENT or (\n"
          "                mine.protects_predictions and not theirs.protects_predictions):\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-gdp-weaker", "the refusal of a task at a weaker GDP level than the site's (or a smaller k)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if rank(theirs.kind.value) < rank(mine.kind.value) or (\n",
          "        if False and (  # MUTANT\n"),),
    ),
    Mutant(
        "policy-gdp-larger-d", "the refusal of a task asking a larger degree bound D than the site's",
        (("connectors/graphveil/connectors/flower/settings.py",
          "            if theirs.degree_bound > mine.degree_bound:\n",
          "            if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-gdp-smaller-d", "the refusal of a smaller D (a graph above it would be refused after reading)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "            if theirs.degree_bound < mine.degree_bound:\n",
          "            if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-gdp-no-site-d", "the refusal of a D at a site that sets no degree-bound",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if theirs.degree_bound is not None and mine.degree_bound is None:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "policy-gdp-components", "the check that sampler, clipper and accountant analyse the site's GDP unit",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if accepts is None or not accepts(mine):\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "site-gdp-unit", "the site's own GDP unit (with D) in a node-classification site's run config",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        privacy[\"unit\"] = site.gdp_unit.value\n",
          "        pass  # MUTANT: the task's unit stands\n"),),
    ),
    Mutant(
        "site-round-reservation", "the reservation of a GAP round's releases with its steps (steps only)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    accountant = (_RoundCurve(session.accountant, session.planned_rdp(local_steps), local_steps)\n"
          "                  if releases else session.accountant)\n",
          "    accountant = session.accountant  # MUTANT: the releases are not reserved\n"),),
    ),
    Mutant(
        "site-releases-after-reservation", "a GAP round's releases computed after its reservation (before it)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    if not public and not releases:  # nothing is released before training: prepare in full, as before\n",
          "    if not public:  # MUTANT: the releases run before the reservation\n"),),
    ),
    Mutant(
        "site-node-scores", "no evaluation at a node-classification site (it would run DP-SAGE's output release)",
        (("connectors/graphveil/connectors/flower/site.py",
          "    if site.node_task:\n        return {\"mrr\": math.nan, \"prec1\": math.nan}\n",
          "    pass  # MUTANT: evaluated\n"),),
    ),
    Mutant(
        "dpgcn-weights-only", "DP-GCN's refusal of a GDP unit covering predictions (its predictions read raw neighbours)",
        (("plugins/graphveil/plugins/dp_gcn/units.py",
          "    return (unit.kind in _SPLIT_LOCAL and unit.adjacency is Adjacency.REPLACEMENT\n"
          "            and not unit.protects_predictions)\n",
          "    return unit.kind in _SPLIT_LOCAL and unit.adjacency is Adjacency.REPLACEMENT  # MUTANT\n"),),
    ),
    Mutant(
        "dpgcn-train-side", "DP-GCN's training graph as the training nodes' induced subgraph (held-out nodes split too)",
        (("plugins/graphveil/plugins/dp_gcn/task.py",
          "        self.train_graph = data.subgraph(self.split.train, name=f\"{data.name}[train]\")\n",
          "        self.train_graph = data  # MUTANT\n"),),
    ),
    Mutant(
        "site-release-scope", "a node site's release-scope 'weights' in its unit (the unit always covers predictions)",
        (("connectors/graphveil/connectors/flower/settings.py",
          "protects_predictions=self.release_scope == \"predictions\",",
          "protects_predictions=True,  # MUTANT"),),
    ),
    Mutant(
        "policy-task-weights-only", "the refusal of a task asking a weights-only unit where the site covers predictions",
        (("connectors/graphveil/connectors/flower/settings.py",
          "                mine.protects_predictions and not theirs.protects_predictions):\n",
          "                False):  # MUTANT\n"),),
    ),
    Mutant(
        "policy-task-predictions", "the refusal of a task asking predictions covered where the site's scope is weights",
        (("connectors/graphveil/connectors/flower/settings.py",
          "        if theirs.protects_predictions and not mine.protects_predictions:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "site-ledger-unit", "a node site's refusal, before any session, of a ledger bound to another unit or scope",
        (("connectors/graphveil/connectors/flower/site.py",
          "    _check_ledger_unit(ledger, site)\n",
          "    pass  # MUTANT: the ledger's binding is checked only at the reservation\n"),),
    ),
    Mutant(
        "ledger-scope-binding", "the release scope (/predictions) in the unit a ledger is bound to",
        (("framework/graphveil/ledger/ledger.py",
          "        unit = getattr(getattr(accountant, \"unit\", None), \"value\", None) or \"unknown\"\n",
          "        unit = (getattr(getattr(accountant, \"unit\", None), \"value\", None) or \"unknown\")"
          ".removesuffix(\"/predictions\")  # MUTANT\n"),),
    ),
    Mutant(
        "gap-encoder-start", "GAP's encoder trained from the weights it was handed (the server's), not its own init",
        (("plugins/graphveil/plugins/gdp/gap.py",
          "            load_checked(model, self._start, ENCODER)\n",
          "            pass  # MUTANT: the given weights are ignored\n"),),
    ),
    Mutant(
        "gap-encoder-shared", "GAP's trained encoder weights in the shared state (sent with the classifier)",
        (("plugins/graphveil/plugins/gdp/gap.py",
          "        return {} if self.model is None else self.model.trainable_state()\n",
          "        return {}  # MUTANT: the encoder is not shared\n"),),
    ),
    Mutant(
        "gap-encoder-seed", "GAP's first encoder from the task's encoder_seed (alike at every site), not the run's seed",
        (("plugins/graphveil/plugins/gdp/gap.py",
          "            torch.manual_seed(p.encoder_seed if p.encoder_seed is not None\n"
          "                              else int(torch.randint(2**62, (1,), generator=self.generator)))\n",
          "            torch.manual_seed(int(torch.randint(2**62, (1,), generator=self.generator)))  # MUTANT\n"),),
    ),
    Mutant(
        "dpdgc-projection-seed", "DPDGC's projection R from the task's projection_seed (one R across sites and rounds)",
        (("plugins/graphveil/plugins/gdp/dpdgc.py",
          "        projection = (self.generator if p.projection_seed is None\n"
          "                      else torch.Generator().manual_seed(p.projection_seed))\n",
          "        projection = self.generator  # MUTANT: R follows the run's (the site's) seed\n"),),
    ),
    Mutant(
        "site-release-start", "a site hands the releases their weights (GAP's encoder) before they run",
        (("connectors/graphveil/connectors/flower/site.py",
          "        model_state = session.start_releases_from(incoming)\n",
          "        model_state = incoming  # MUTANT: the releases start from their own init\n"),),
    ),
    Mutant(
        "witness-server-reject", "the server's refusal to aggregate an update whose ledger went backwards or forked",
        (("connectors/graphveil/connectors/flower/strategy.py",
          '            if entry["status"] == records.TRAINED:\n'
          '                entry.update(status=records.FAILED, reason=f"rejected reply: {problem}; not aggregated")\n',
          "            pass  # MUTANT: aggregated anyway\n"),),
    ),
    # ---------------------------------------------------------------- issue 29: ghost clipping
    Mutant(
        "ghost-cross-term", "the cross-token terms of the ghost norm (only t = t' pairs summed)",
        (("framework/graphveil/engine/grad_samplers/groups.py",
          "            out += terms[:, :, : hi - lo].sum((1, 2)).double() + 2 * terms[:, :, hi - lo :].sum((1, 2)).double()\n",
          "            out += terms[:, :, : hi - lo].diagonal(0, 1, 2).sum(1).double()  # MUTANT\n"),),
    ),
    Mutant(
        "ghost-block-twice", "the second count of the ghost norm's off-diagonal Gram blocks (only the upper triangle formed)",
        (("framework/graphveil/engine/grad_samplers/groups.py",
          "            out += terms[:, :, : hi - lo].sum((1, 2)).double() + 2 * terms[:, :, hi - lo :].sum((1, 2)).double()\n",
          "            out += terms.sum((1, 2)).double()  # MUTANT\n"),),
        note="one block (tuples under 64 tokens) hides it: the tests force blocks of 1 and 2 tokens",
    ),
    Mutant(
        "ghost-block-key", "the token block in the key of a shared input Gram (every block reuses the first one's)",
        (("framework/graphveil/engine/grad_samplers/groups.py",
          "        key = (share, a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device, lo, hi)\n",
          "        key = (share, a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device)  # MUTANT\n"),),
    ),
    Mutant(
        "bookkeeping-factors", "the clipping factors in a ghost linear's weighted sum (unclipped sum)",
        (("framework/graphveil/engine/grad_samplers/linear.py",
          "        if g.shape[-1] <= a.shape[-1]:\n            g = g * f\n        else:\n            a = a * f\n",
          "        pass  # MUTANT: factors not folded in\n"),),
    ),
    Mutant(
        "bookkeeping-fold-side", "the factors folded into the inputs when the output is the wider record",
        (("framework/graphveil/engine/grad_samplers/linear.py",
          "        else:\n            a = a * f\n",
          "        else:\n            pass  # MUTANT\n"),),
    ),
    Mutant(
        "ghost-choice-rule", "mixed ghost clipping's per-layer rule (swapped: ghost for narrow layers)",
        (("framework/graphveil/engine/grad_samplers/groups.py",
          "        return length * (d + p) < d * p\n",
          "        return length * (d + p) > d * p  # MUTANT\n"),),
    ),
    Mutant(
        "shared-gram-strides", "the strides in the key of a shared input Gram (xᵀ shares x's Gram)",
        (("framework/graphveil/engine/grad_samplers/groups.py",
          "        key = (share, a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device, lo, hi)\n",
          "        key = (share, a.data_ptr(), tuple(a.shape), a.dtype, a.device, lo, hi)  # MUTANT\n"),),
    ),
    Mutant(
        "output-edges", "the recorded outputs as what the engine's backward differentiates",
        (("framework/graphveil/engine/per_tuple.py",
          "                self._edges.append(get_gradient_edge(out))\n",
          "                pass  # MUTANT: nothing to differentiate unless verifying\n"),),
    ),
    Mutant(
        "inplace-input-check", "the engine's check that no recorded input changed in place before the backward",
        (("framework/graphveil/engine/per_tuple.py",
          "        if _versions(saved) != versions:\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "witness-reply-head", "the ledger head in a refused or failed reply sent after the ledger was opened",
        (("connectors/graphveil/connectors/flower/site.py",
          "                head = ledger.witness_head()\n",
          "                pass  # MUTANT: no head after a refusal\n"),),
    ),
    Mutant(
        "node-split-unlabelled", "keeping unlabelled nodes (y = -1) off every side of the random node split",
        (("framework/graphveil/data/node_split.py",
          "    sides[~graph.labelled] = UNLABELLED  # keyed per id: no labelled node changes side\n",
          "    pass  # MUTANT\n"),),
    ),
    Mutant(
        "pyg-node-ids", "a pyg part's own node ids (the keyed split would renumber a site's nodes 0..n-1)",
        (("plugins/graphveil/plugins/standard/sources/pyg.py",
          "        graph = replace(graph, node_ids=ids)\n",
          "        pass  # MUTANT\n"),),
    ),
    Mutant(
        "node-table-ragged", "the refusal of feature vectors of different lengths in a list column",
        (("framework/graphveil/data/node_table.py",
          "    if ragged.size:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "sim-own-partition", "a simulated site's node config by its own partition id (all read site 1's)",
        (("connectors/graphveil/connectors/flower/settings.py",
          '        toml_path = Path(sites[str(int(node_config["partition-id"]))])\n',
          '        toml_path = Path(sites["0"])  # MUTANT\n'),),
    ),
    Mutant(
        "sim-deployed-node-config", "a deployed SuperNode's node config kept even when a simulation listing is set",
        (("connectors/graphveil/connectors/flower/settings.py",
          "    if set(node_config) != SIMULATED_NODE_KEYS or not os.environ.get(SITES_ENV):\n",
          "    if not os.environ.get(SITES_ENV):  # MUTANT\n"),),
    ),
    Mutant(
        "sim-site-node-config", "the ClientApp resolving a virtual node's site node config (simulation)",
        (("connectors/graphveil/connectors/flower/site.py",
          "        node_config = site_node_config(context.node_config)\n",
          "        node_config = context.node_config  # MUTANT\n"),),
    ),
    Mutant(
        "node-table-sparse-unknown", "the refusal of a sparse feature row naming an unknown node",
        (("framework/graphveil/data/node_table.py",
          "    if node.null_count:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "pma-aggregate-last-chunk", "the last chunk of edges of PMA's chunked sum A·H (issue 28): "
        "without it some in-neighbours are left out of a released aggregate",
        (("plugins/graphveil/plugins/gdp/common.py",
          "    for start in range(0, src.numel(), step):\n",
          "    for start in range(0, src.numel() - step, step):  # MUTANT: the tail chunk dropped\n"),),
    ),
    Mutant(
        "parquet-edge-unknown-id", "the refusal of a relation naming an unknown node id in the column-wise "
        "lookup of the parquet node path (issue 28)",
        (("plugins/graphveil/plugins/standard/sources/parquet.py",
          "    if bad.size:\n",
          "    if False:  # MUTANT\n"),),
    ),
    Mutant(
        "bootstrap-multinomial-shares", "the bootstrap of few distinct values by multinomial counts at each "
        "value's share (issue 28): uniform shares resample another distribution",
        (("framework/graphveil/evaluation.py",
          "        shares = counts.double().numpy() / m\n",
          "        shares = np.full(distinct.numel(), 1.0 / distinct.numel())  # MUTANT\n"),),
    ),
    Mutant(
        "node-graph-reverse-check", "NodeGraph's refusal of an edge without its reverse, by comparing the "
        "sorted reverse keys with the keys (issue 28: no isin over 2·10⁷ columns)",
        (("framework/graphveil/data/node_graph.py",
          "    if torch.equal(torch.sort(v * n + u).values, keys):\n",
          "    if True:  # MUTANT\n"),),
    ),
    Mutant(
        "integer-id-index-gap", "IntegerIdIndex's binary search (issue 28) accepting only an exact match: "
        "without it an unknown id between two sparse ids takes its neighbour's position",
        (("framework/graphveil/data/node_table.py",
          "        found = (self.sorted[at] == values) & inside\n",
          "        found = inside  # MUTANT\n"),),
    ),
    Mutant(
        "integer-id-index-range", "IntegerIdIndex's dense table (issue 28) used only for ids within its "
        "range: without the range test an id below the smallest wraps around to another node",
        (("framework/graphveil/data/node_table.py",
          "        every = bool(inside.all())\n",
          "        every = True  # MUTANT\n"),),
    ),
    Mutant(
        "split-positions-key", "the batch HMAC of the transfer / node split (issue 28) keyed with the "
        "split key; another key is another split than split_position's",
        (("framework/graphveil/data/split.py",
          "        h = copy()\n",
          "        h = hmac.new(key[:-1] + b\"x\", digestmod=\"sha256\")  # MUTANT\n"),),
    ),
    Mutant(
        "relational-side-positions", "the relational task's test-side positions from the split mask "
        "(issue 28): the training side's instead evaluates on training entities",
        (("plugins/graphveil/plugins/relational/task.py",
          "on_train.nonzero().flatten(), (~on_train).nonzero().flatten()\n",
          "on_train.nonzero().flatten(), on_train.nonzero().flatten()  # MUTANT\n"),),
    ),
    Mutant(
        "node-ids-set-check", "NodeGraph's fast check of distinct non-empty string ids (issue 28): "
        "accepting without it lets a repeated node id through",
        (("framework/graphveil/data/node_graph.py",
          "    if set(map(type, ids)) == {str} and len(distinct := set(ids)) == len(ids) and \"\" not in distinct:\n",
          "    if True:  # MUTANT\n"),),
    ),
    Mutant(
        "to-relational-sorted", "to_relational's sort of an unsorted edge_index (issue 28 skips it for a "
        "sorted one): without it the relations are out of order",
        (("framework/graphveil/data/node_graph.py",
          "        if not bool((keys[1:] > keys[:-1]).all()):  # the builders' edge_index is sorted: no argsort\n",
          "        if False:  # MUTANT\n"),),
    ),
    Mutant(
        "node-predict-chunks", "a row-wise node model predicts every node, in chunks of rows (issue 28): "
        "a chunk left out loses the last nodes' predictions",
        (("plugins/graphveil/plugins/node_classification/task.py",
          "                              for i in range(0, x.shape[0], PREDICT_ROWS)])\n",
          "                              for i in range(0, x.shape[0] - 1, PREDICT_ROWS)])  # MUTANT\n"),),
    ),
    Mutant(
        "subgraph-both-ends", "RelationalGraph.subgraph keeps a relation only when both ends are kept "
        "(issue 28's mask gather): one end lets cross relations into a side",
        (("framework/graphveil/data/graph.py",
          "        inside = keep[self.edges[:, 0]] & keep[self.edges[:, 1]]\n",
          "        inside = keep[self.edges[:, 0]] | keep[self.edges[:, 1]]  # MUTANT\n"),),
    ),
    Mutant(
        "subgraph-remap-rank", "RelationalGraph.subgraph re-indexes an entity by its rank among the kept "
        "ones: off by one moves every relation to the next entity",
        (("framework/graphveil/data/graph.py",
          "        remap = keep.cumsum(0) - 1  # entity i -> its rank among the kept (read only where kept)\n",
          "        remap = keep.cumsum(0)  # MUTANT\n"),),
    ),
)

# Not a real mutant: breaks the import of graphveil in the copy. --self-test runs it to prove
# that the copy, not the original checkout, is what the suite imports.
CANARY = Mutant(
    "canary-import", "(self-test) importing graphveil fails in the copy",
    (("framework/graphveil/__init__.py", None, "raise ImportError('mutation canary: the copy is imported')\n"),),
)

PREFLIGHT = r"""
import json, sys
from importlib.metadata import entry_points
import importlib
import graphveil, graphveil.plugins, graphveil.connectors
mods = {m.__name__: m.__file__ for m in (graphveil, graphveil.plugins, graphveil.connectors)}
for ep in entry_points(group="graphveil"):
    mods[ep.value] = importlib.import_module(ep.value).__file__
print(json.dumps(mods))
"""


# ------------------------------------------------------------------------------------- copying
def source_files(repo: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files (git's view of the working tree)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    files = []
    for rel in sorted(set(filter(None, out.split("\0")))):
        if rel.split("/", 1)[0] in EXCLUDED_TOP:
            continue
        if (repo / rel).is_file():  # tracked files deleted in the working tree are skipped
            files.append(rel)
    # the install's compiled extensions (ignored by git): a copy runs the checkout's noise kernel,
    # and a mutated kernel source no longer matches it (tests/engine/test_noise_kernel.py)
    built = [str(p.relative_to(repo)) for root in ("framework", "plugins", "connectors") for p in (repo / root).rglob("*.so")]
    return files + sorted(built)


def make_copy(repo: Path, files: list[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target, follow_symlinks=False)


def apply(mutant: Mutant, root: Path) -> None:
    """Apply every edit; each snippet must occur exactly once (``None``: prepend)."""
    for rel, old, new in mutant.edits:
        path = root / rel
        text = path.read_text(encoding="utf-8")
        if old is None:
            text = new + text
        else:
            count = text.count(old)
            if count != 1:
                raise SetupError(f"mutant {mutant.id}: snippet occurs {count} times in {rel} (must be exactly once):\n{old}")
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")


def check_applies(mutant: Mutant, repo: Path) -> None:
    for rel, old, _ in mutant.edits:
        if old is None:
            continue
        count = (repo / rel).read_text(encoding="utf-8").count(old)
        if count != 1:
            raise SetupError(f"mutant {mutant.id}: snippet occurs {count} times in {rel} (must be exactly once):\n{old}")


class SetupError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------- running
def environment(copy_root: Path, site_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["GRAPHVEIL_MUTATION_ROOT"] = str(copy_root)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def preflight(python: str, copy_root: Path, env: dict[str, str]) -> None:
    """Every graphveil module and entry point must come from the copy."""
    proc = subprocess.run([python, "-c", PREFLIGHT], cwd=copy_root, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SetupError(f"preflight import failed in {copy_root}:\n{proc.stderr[-3000:]}")
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    outside = {k: v for k, v in files.items() if not str(Path(v).resolve()).startswith(str(copy_root.resolve()) + os.sep)}
    if outside:
        raise SetupError(f"isolation broken: imported from outside the copy {copy_root}: {outside}")


# pytest's short summary ("FAILED tests/x.py::t - ..."), not captured log lines ("ERROR    logger:...")
FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+\.py(?:::\S+)?)", re.M)


@dataclass
class Result:
    id: str
    removes: str
    status: str  # killed | survived | timeout | baseline
    first_failure: str
    seconds: float
    note: str = ""


def run_suite(python: str, copy_root: Path, env: dict[str, str], tests: list[str], timeout: float,
              log: Path) -> tuple[int | None, str, float]:
    argv = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, cwd=copy_root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    match = FAILED_LINE.search(text)
    first = match.group(2) if match else ""
    if code not in (0, None) and not first:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()]
        first = f"(exit {code}) " + (tail[-1][:160] if tail else "")
    return code, first, seconds


def run_one(mutant: Mutant | None, files: list[str], python: str, tests: list[str], timeout: float,
            keep: Path | None, expect_import_failure: bool = False) -> Result:
    work = Path(tempfile.mkdtemp(prefix=f"graphveil-mutant-{mutant.id if mutant else 'baseline'}-"))
    try:
        copy_root = work / REPO.name
        make_copy(REPO, files, copy_root)
        shared = REPO.parent / "shared"  # tests/conftest.py finds shared data next to the checkout
        if shared.is_dir():
            (work / "shared").symlink_to(shared)
        site_dir = work / "_mutation_site"
        site_dir.mkdir()
        shutil.copy2(HERE / "sitecustomize.py", site_dir / "sitecustomize.py")
        env = environment(copy_root, site_dir)
        if not expect_import_failure:
            preflight(python, copy_root, env)  # unmutated imports resolve into the copy
        if mutant is not None:
            apply(mutant, copy_root)
        log = (keep or work) / f"{mutant.id if mutant else 'baseline'}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        code, first, seconds = run_suite(python, copy_root, env, tests, timeout, log)
        if mutant is None:
            status = "passed" if code == 0 else ("timeout" if code is None else "failed")
        else:
            status = "survived" if code == 0 else ("timeout" if code is None else "killed")
        return Result(mutant.id if mutant else "baseline", mutant.removes if mutant else "(no mutant)",
                      status, first, seconds, mutant.note if mutant else "")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def isolation_proof(files: list[str], python: str) -> dict[str, str]:
    """Where graphveil, its layers and its entry points are imported from, in a fresh copy."""
    work = Path(tempfile.mkdtemp(prefix="graphveil-mutant-proof-"))
    try:
        copy_root = work / REPO.name
        make_copy(REPO, files, copy_root)
        site_dir = work / "_mutation_site"
        site_dir.mkdir()
        shutil.copy2(HERE / "sitecustomize.py", site_dir / "sitecustomize.py")
        env = environment(copy_root, site_dir)
        preflight(python, copy_root, env)
        proc = subprocess.run([python, "-c", PREFLIGHT], cwd=copy_root, env=env, capture_output=True, text=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(results: list[Result]) -> str:
    rows = [("mutant", "removes", "result", "first failing test", "seconds")]
    rows += [(r.id, r.removes, r.status, r.first_failure or "-", f"{r.seconds:.0f}") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    widths[1] = min(widths[1], 70)
    widths[3] = min(widths[3], 90)
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell[: widths[i]].ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="run only this mutant (repeatable)")
    parser.add_argument("--skip-in-flux", action="store_true",
                        help="skip the mutants marked in-flux (code being rewritten by issue 6)")
    parser.add_argument("--tests", action="append", default=[], metavar="PATTERN",
                        help="pytest arguments selecting tests (repeatable; default: the whole suite)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per suite run (default 3600)")
    parser.add_argument("--no-baseline", action="store_true", help="do not run the unmutated suite first")
    parser.add_argument("--self-test", action="store_true",
                        help="prove isolation: a mutant that breaks importing graphveil in the copy must fail")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR", help="keep each run's pytest output here")
    parser.add_argument("--python", default=sys.executable, help="python of the venv (default: this one)")
    args = parser.parse_args(argv)

    if args.list:  # also checks that every snippet still occurs exactly once in the checkout
        stale = 0
        for m in MUTANTS:
            where = ", ".join(sorted({e[0] for e in m.edits}))
            counts = [(REPO / e[0]).read_text().count(e[1]) if (REPO / e[0]).is_file() else 0 for e in m.edits]
            flag = "" if all(c == 1 for c in counts) else f"  [STALE: snippet found {counts} times]"
            stale += bool(flag)
            print(f"{m.id:20s} {where:35s} {m.removes}" + (f"  [{m.note}]" if m.note else "") + flag)
        return 2 if stale else 0
    known = {m.id for m in MUTANTS}
    unknown = [i for i in args.only if i not in known]
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; --list shows the ids")
    selected = [m for m in MUTANTS if (not args.only or m.id in args.only)
                and not (args.skip_in_flux and "in-flux" in m.tags)]
    try:
        for m in selected:
            check_applies(m, REPO)  # fail before any copying if a snippet went stale
        files = source_files(REPO)
        results: list[Result] = []
        if args.self_test:
            print("preflight (unmutated copy):", json.dumps(isolation_proof(files, args.python), indent=1), flush=True)
            r = run_one(CANARY, files, args.python, args.tests, args.timeout, args.keep_logs, expect_import_failure=True)
            print(f"{r.id}: {r.status} in {r.seconds:.0f} s {r.first_failure}", flush=True)
            if r.status != "killed":
                raise SetupError("self-test: breaking graphveil in the copy did not fail the suite; "
                                 "the suite does not import the copy")
            results.append(r)
            if not args.only:  # --self-test alone runs only the canary
                selected = []
        if not args.no_baseline and selected:
            base = run_one(None, files, args.python, args.tests, args.timeout, args.keep_logs)
            print(f"baseline: {base.status} in {base.seconds:.0f} s {base.first_failure}", flush=True)
            if base.status != "passed":
                raise SetupError(f"the unmutated suite does not pass ({base.status}: {base.first_failure}); "
                                 "fix that first (or pass --no-baseline to run anyway)")
        for m in selected:
            r = run_one(m, files, args.python, args.tests, args.timeout, args.keep_logs)
            results.append(r)
            print(f"{r.id}: {r.status} in {r.seconds:.0f} s {r.first_failure}", flush=True)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(table(results))
    if args.json:
        payload = {"tests": args.tests or ["(whole suite)"], "results": [vars(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    bad = [r for r in results if r.status != "killed"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
