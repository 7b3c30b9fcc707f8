"""DP step time / non-private step time for FULL fine-tuning of a BERT-style encoder vs LoRA.

Five configurations of the text encoders, in ONE run (one worker subprocess each, one after
the other), on the SAME batches of tuples (bundled CiteSeer texts, uniform negatives):

* ``minilm-lora`` / ``minilm-full``: the packaged MiniLM (6 layers, hidden 384, 22.7M weights),
  ``finetune: lora`` (the defaults: r=8 on query/value of the top 2 layers) / ``finetune: full``;
* ``bert-base-lora`` / ``bert-base-full``: a RANDOM BERT-base-sized model (hidden 768, 12 layers,
  12 heads, FFN 3072, 109M weights) built from a config and saved to a temporary directory once
  (nothing is downloaded; MiniLM's tokenizer, the same 30522-token uncased vocabulary);
* ``llama-lora``: the decoder encoder ``hf_causal_lora`` (defaults: r=8 on q_proj/v_proj of the top
  2 layers, last-token pooling) on a RANDOM Llama of the same width and depth (hidden 768, 12
  layers, 12 query / 4 key-value heads, rotary positions, SwiGLU FFN 2048, MiniLM's tokenizer).

In each worker the modes run interleaved step by step (order rotated), as in
``bench/dp_step_speed.py``, so load from other processes hits them alike:

* ``nonprivate`` — :func:`graphveil.engine.dp_step.nonprivate_step` (mean loss, backward, Adam);
* ``dp``         — :func:`graphveil.engine.dp_step.dp_step` as a run does it: per-tuple norms
  (ghost / book-keeping, ``auto``), clipping, the default secure noise (AES-256 keyed from the OS
  CSPRNG, 4-sum), DP-Adam;
* ``dp_randn``   — the same ``dp_step`` with the noise drawn by ``torch.randn`` (NOT private: a
  measuring device, what the step would cost with the noise at ``torch.randn`` speed);
* ``dp_no_noise`` — the same ``dp_step`` adding no noise (NOT private): the engine alone;
* ``opacus_ghost`` (BERT-style encoders) — Opacus 1.6 ghost clipping
  (``GradSampleModuleFastGradientClipping``, two backward passes, as its
  ``DPTensorFastGradientClipping.backward``) over the same encoder stack, noise by
  ``torch.randn``, Adam. Opacus clips per SAMPLE and needs one loss per sample; the tuple loss
  couples 2 + k sequences, so here each SEQUENCE is an example with its own loss (1 − cosine to a
  fixed random target): the per-example part of the work, not the tuple clipping a run needs.

Reported: the median over steps of the PAIRED ratio to the non-private step on the same batch,
beside the goal of issue 29 (full fine-tuning ≤ 1.3×, LoRA ≤ 1.03×, read on ``dp``: the step a
run takes, secure noise included), the same paired ratio of process CPU time, and the 1-minute
load average before and after the timed steps. Then, for the full configurations, a phase
breakdown (median of ``--phase-reps`` repetitions) of one step done with the public API (module
``step_phases``): the non-private forward, backward, Adam; the DP step's forward (recording),
backward + per-tuple norms (``compute``), clipping factors, clipped weighted sums
(``accumulate``), noise (the secure draw), Adam; Opacus' forward, first backward (norms), second
backward (clipped sum), noise, Adam; with ``--materialize`` also the engine forced to
materialise per-example gradients of every linear (memory: b × weights).

    python bench/full_finetune_speed.py [--configs ...] [--batch 8] [--k-neg 2] [--steps 3] [--threads 1]
                                        [--device cuda] [--dtype bfloat16] [--json FILE]

``--device`` (``bench/_device.py``): model, batches and noise on that device; each timed step and
phase ends when the device's queued work does. ``--dtype bfloat16``: the decoder's frozen base
model and cache in bfloat16 (``hf_causal_lora``'s ``dtype``; LoRA factors stay float32); the
BERT-style configurations have no dtype option and stay float32. ``--json FILE``: the results in
FILE (one JSON) instead of appended to ``bench/results/full_finetune_speed.jsonl``.

Results: a markdown table on stdout, one JSON line per configuration appended to
``bench/results/full_finetune_speed.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _device import add_device_argument, batches_to, place, synchronize
from step_phases import phase_table

MODES = ("nonprivate", "dp", "dp_randn", "dp_no_noise", "opacus_ghost")
CONFIGS = ("minilm-lora", "minilm-full", "bert-base-lora", "bert-base-full", "llama-lora")
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
LLAMA = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
             intermediate_size=2048)
RESULTS = Path(__file__).parent / "results" / "full_finetune_speed.jsonl"
GOAL = {"lora": 1.03, "full": 1.3}  # issue 29: DP step (secure noise) / non-private step


def make_random_model(directory: str, kind: str) -> None:
    """A random ``bert-base`` or ``llama`` model + MiniLM's tokenizer in ``directory`` (seeded, offline)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaModel

    from graphveil.plugins.hf_common import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    torch.manual_seed(0)
    if kind == "bert-base":
        model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, **BERT_BASE))
    else:
        model = LlamaModel(LlamaConfig(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id, **LLAMA))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def setup(args: argparse.Namespace):
    """(encoder, step functions by mode, batches, pieces for the phase breakdown)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    from step_phases import NoNoise, RandnNoise

    from graphveil.contract.sampler import TupleBatch
    from graphveil.data.loaders import load_bundled_citeseer
    from graphveil.engine.dp_step import GaussianNoise, build_optimizer, dp_step, nonprivate_step
    from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper  # the clipper a run uses
    from graphveil.plugins.hf_causal.encoder import HfCausalEncoder, HfCausalParams
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams
    from graphveil.plugins.relational.losses import LossSpec
    from graphveil.run.config import TrainingConfig

    model, finetune = args.config.rsplit("-", 1)
    graph = load_bundled_citeseer().subgraph(torch.arange(args.entities))
    if model == "llama":
        encoder = HfCausalEncoder(HfCausalParams(model=args.model_dir, max_length=args.max_length,
                                                 device=args.device, dtype=args.dtype))
    else:
        encoder = HfLoraEncoder(HfLoraParams(model="minilm" if model == "minilm" else args.model_dir,
                                             finetune=finetune, max_length=args.max_length))
    place(encoder, args.device)
    encoder.prepare(graph)
    encoder.train()
    training = TrainingConfig(optimizer="adam", lr=1e-5)
    loss = LossSpec.from_config(training)
    optimizer = build_optimizer(encoder.trainable_parameters(), training)
    clipper = PerTupleEdgeClipper(PerTupleEdgeClipper.Params(clip_norm=args.clip))

    data = torch.Generator().manual_seed(1234)
    batches = []
    for _ in range(args.warmup + args.steps):
        pos = graph.edges[torch.randint(0, graph.num_edges, (args.batch,), generator=data)]
        neg = torch.randint(0, graph.num_nodes, (args.batch, args.k_neg), generator=data)
        which = torch.randint(0, 2, (args.batch, args.k_neg), generator=data)
        batches.append(TupleBatch(pos, neg, torch.gather(pos, 1, which)))
    batches = batches_to(batches, args.device)

    def ours(fn, noise):
        def step(batch, series=None) -> None:
            fn(encoder, batch, clipper=clipper, noise_multiplier=args.sigma, expected_batch_size=args.batch,
               optimizer=optimizer, loss=loss, noise=noise)

        return step

    steps = {"nonprivate": ours(nonprivate_step, None), "dp": ours(dp_step, GaussianNoise()),
             "dp_randn": ours(dp_step, RandnNoise()), "dp_no_noise": ours(dp_step, NoNoise())}
    if model != "llama":
        steps["opacus_ghost"] = opacus_ghost_step(args, encoder, optimizer, RandnNoise())
    return encoder, steps, batches, (optimizer, loss, clipper, GaussianNoise())


def opacus_ghost_step(args: argparse.Namespace, encoder, optimizer, noise):
    """Opacus' ghost clipping over ``encoder.top``, one example per SEQUENCE (module note)."""
    import warnings

    import torch
    import torch.nn.functional as F
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
    from step_phases import timed

    from graphveil.engine.dp_step import add_noise

    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message="Full backward hook")
    gsm = GradSampleModuleFastGradientClipping(encoder.top, batch_first=True, loss_reduction="sum",
                                               max_grad_norm=args.clip, use_ghost_clipping=True, strict=False)
    gsm.remove_hooks()  # hooks (even disabled ones) only while an Opacus step runs: not on the other modes
    params = list(encoder.trainable_parameters())
    target = F.normalize(torch.randn(4096, encoder.dim, generator=torch.Generator().manual_seed(7)), dim=-1)
    target = target.to(encoder.device)

    class TwoPhases(DPTensorFastGradientClipping):
        """Opacus' backward (first backward → norms → rescaled second backward), timed per pass."""

        series = None

        def backward(self) -> None:
            losses = self.loss_per_sample
            timed(self.series, "backward 1 (norms)", lambda: losses.sum().backward(retain_graph=True))
            self.optimizer.zero_grad()
            coeff = gsm.get_clipping_coef()
            self.module.disable_hooks()
            timed(self.series, "backward 2 (clipped sum)", lambda: (coeff * losses).sum().backward())

    def step(batch, series=None) -> None:
        gsm.add_hooks(loss_reduction="sum", batch_first=True)
        optimizer.zero_grad(set_to_none=True)

        def forward():
            emb = gsm(*encoder.cached_inputs(batch.entities().reshape(-1)))
            return 1.0 - (emb * target[: emb.shape[0]]).sum(-1)  # one loss per sequence

        losses = timed(series, "forward", forward)
        tensor = TwoPhases(gsm, optimizer, losses, loss_reduction="sum")
        tensor.series = series
        tensor.backward()
        timed(series, "noise", lambda: add_noise([p.grad for p in params], noise, args.sigma * args.clip))
        for p in params:
            p.grad.div_(args.batch)
        timed(series, "adam", optimizer.step)
        gsm.remove_hooks()

    return step


def phases(args, encoder, steps, batches, pieces) -> dict[str, dict[str, float]]:
    """Median seconds per phase of the non-private step, the DP step (engine modes) and Opacus."""
    from step_phases import dp_phases, medians, nonprivate_phases

    from graphveil.engine.per_tuple import PerTupleGrad

    optimizer, loss, clipper, noise = pieces
    out: dict[str, dict[str, list[float]]] = {}
    engines = {"auto": PerTupleGrad(encoder, verify=False)}
    if args.materialize:
        engines["materialize"] = PerTupleGrad(encoder, mode="materialize", verify=False)
    for batch in batches[: args.phase_reps]:
        nonprivate_phases(out.setdefault("nonprivate", {}), encoder, batch, loss, optimizer)
        for mode, engine in engines.items():
            dp_phases(out.setdefault(f"dp_{mode}", {}), encoder, engine, batch, loss, clipper, noise,
                      args.sigma * clipper.clip_norm, optimizer)
        if "opacus_ghost" in steps:
            steps["opacus_ghost"](batch, out.setdefault("opacus_ghost (per sequence)", {}))
    return medians(out)


def worker(args: argparse.Namespace) -> dict:
    import torch

    encoder, steps, batches, pieces = setup(args)
    modes = [m for m in MODES if m in steps]
    for batch in batches[: args.warmup]:
        for mode in modes:
            steps[mode](batch)
    synchronize(args.device)
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    load_before = os.getloadavg()[0]
    for i, batch in enumerate(batches[args.warmup :]):
        for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:  # rotate the order
            t0, c0 = time.perf_counter(), time.process_time()
            steps[mode](batch)
            synchronize(args.device)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)

    def paired(series: dict[str, list[float]]) -> dict[str, float]:
        return {m: statistics.median(x / y for x, y in zip(series[m], series["nonprivate"], strict=True))
                for m in modes[1:]}

    result = {
        "config": args.config,
        "trainable_params": sum(p.numel() for p in encoder.trainable_parameters()),
        "median_s": {m: statistics.median(wall[m]) for m in modes},
        "paired_ratio": paired(wall),
        # process CPU time: with one thread, the work done, less sensitive to other processes' load
        "paired_cpu_ratio": paired(cpu),
        "loadavg_before": load_before,
        "loadavg": os.getloadavg()[0],
    }
    if args.config.endswith("-full"):
        result["phases_s"] = phases(args, encoder, steps, batches[args.warmup :], pieces)
    torch.set_num_threads(args.threads)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--batch", type=int, default=8, help="tuples per step")
    parser.add_argument("--k-neg", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--phase-reps", type=int, default=1, help="repetitions of the phase breakdown")
    parser.add_argument("--materialize", action="store_true", help="also break down a materialise-everything engine")
    parser.add_argument("--entities", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--sigma", type=float, default=1.0)
    add_device_argument(parser)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of the decoder's (llama-lora) frozen base model and cache")
    parser.add_argument("--json", help="write the results here (one JSON) instead of appending to " + RESULTS.name)
    parser.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)  # worker subprocess
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:
        print(json.dumps(worker(args)))
        return

    started = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="random-models-") as root:
        for config in args.configs:
            kind = config.rsplit("-", 1)[0]
            model_dir = Path(root) / kind
            if kind != "minilm" and not model_dir.exists():
                make_random_model(str(model_dir), kind)
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--config", config, "--model-dir", str(model_dir)],
                capture_output=True, text=True, check=False,
            )
            if out.returncode:
                sys.exit(f"{config} worker failed:\n{out.stderr[-3000:]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{config}: done", file=sys.stderr, flush=True)

    from graphveil.engine import noise_kernel  # the workers' transform: the same install

    print(f"\nb={args.batch} tuples, k_neg={args.k_neg} ({args.batch * (2 + args.k_neg)} sequences/step), "
          f"max_length={args.max_length}, threads={args.threads}, {args.steps} timed steps/mode, "
          f"{os.cpu_count()} CPUs, {time.time() - started:.0f} s; noise transform: {noise_kernel.transform_name()}\n")
    print("| config | trainable | load | non-private s | DP s | DP / non-private (CPU time) | goal | "
          "DP, torch.randn noise / non-private | DP without noise / non-private | "
          "Opacus ghost (per sequence) / non-private (CPU time) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        t, x, c = r["median_s"], r["paired_ratio"], r["paired_cpu_ratio"]
        goal = GOAL[r["config"].rsplit("-", 1)[1]]
        met = "met" if x["dp"] <= goal else "missed"
        opacus = (f"{x['opacus_ghost']:.2f}× ({c['opacus_ghost']:.2f}×)" if "opacus_ghost" in x
                  else "n/a (decoder)")
        print(f"| {r['config']} | {r['trainable_params'] / 1e6:.2f}M | {r['loadavg_before']:.1f}–{r['loadavg']:.1f} | "
              f"{t['nonprivate']:.3f} | {t['dp']:.3f} | **{x['dp']:.2f}×** ({c['dp']:.2f}×) | "
              f"≤ {goal}× ({met}) | {x['dp_randn']:.2f}× | {x['dp_no_noise']:.2f}× | {opacus} |")
    for r in results:
        if "phases_s" in r:
            print(f"\nphases of one step, {r['config']} (median s; DP: the secure noise; Opacus: "
                  "torch.randn):\n")
            print(phase_table(r["phases_s"]))
    print("\nDP / non-private: median over steps of the paired ratio (same batch, back to back, order rotated). "
          "DP uses the default CSPRNG 4-sum noise; 'torch.randn noise' and 'without noise' are the same step "
          "with a fast non-cryptographic draw / none (NOT private; the goal is read on the DP column). "
          "Opacus ghost: one example per sequence (its per-sample losses cannot express tuple losses), "
          "torch.randn noise. (CPU time): the same paired ratio of process CPU time (one thread: the work "
          "done, less sensitive to other processes). load: 1-min load average before and after the timed steps.")
    if args.json:  # instead of the project's results file (bench/gpu_check.py's runs stay out of it)
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with RESULTS.open("a") as f:
        for r in results:
            f.write(json.dumps({"time": stamp, "args": {k: v for k, v in vars(args).items()
                                                        if k not in ("config", "model_dir")}, **r}) + "\n")


if __name__ == "__main__":
    main()
