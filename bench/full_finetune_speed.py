"""DP step time / non-private step time for FULL fine-tuning of a BERT-style encoder vs LoRA.

Four configurations of the ``hf_lora`` encoder, in ONE run (one worker subprocess each, one after
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
  (ghost / book-keeping, ``auto``), clipping, the default secure noise (AES-CTR keyed from the OS CSPRNG, 4-sum), DP-Adam;
* ``dp_no_noise`` — the same ``dp_step`` with a noise object that adds nothing: the per-tuple
  engine's cost alone (NOT private; a measuring device that isolates the noise draw).

Reported: the median over steps of the PAIRED ratio to the non-private step on the same batch.
Then, for the full configurations, a phase breakdown (median of a few repetitions) of one DP step
done with the engine's public API — forward (recording), backward + per-tuple norms
(``compute``), clipped weighted sums (``accumulate``), noise, Adam — next to the non-private
forward, backward, Adam; with ``--materialize`` also the engine forced to materialise
per-example gradients of every linear (memory: b × weights).

    python bench/full_finetune_speed.py [--batch 8] [--k-neg 2] [--steps 3] [--threads 1]
                                        [--device cuda] [--dtype bfloat16]

``--device`` (``bench/_device.py``): model, batches and noise on that device; each timed step
ends when the device's queued work does. ``--dtype bfloat16``: the decoder's frozen base model
and cache in bfloat16 (``hf_causal_lora``'s ``dtype``; LoRA factors stay float32); the BERT-style
configurations have no dtype option and stay float32.

Results: a markdown table on stdout, one JSON line per configuration appended to
``bench/results/full_finetune_speed.jsonl`` (with ``--json FILE``: one JSON in FILE instead).
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

MODES = ("nonprivate", "dp", "dp_no_noise")
CONFIGS = ("minilm-lora", "minilm-full", "bert-base-lora", "bert-base-full", "llama-lora")
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
LLAMA = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
             intermediate_size=2048)
RESULTS = Path(__file__).parent / "results" / "full_finetune_speed.jsonl"
GOAL = {"lora": 1.1, "full": 1.5}


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
    from graphveil.contract.sampler import TupleBatch
    from graphveil.data.loaders import load_bundled_citeseer
    from graphveil.engine.dp_step import (
        GaussianNoise,
        LossSpec,
        build_optimizer,
        dp_step,
        nonprivate_step,
    )
    from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper  # the clipper a run uses
    from graphveil.plugins.hf_causal.encoder import HfCausalEncoder, HfCausalParams
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams
    from graphveil.run.config import TrainingConfig

    class NoNoise(GaussianNoise):
        """Adds nothing (NOT private): isolates the engine's cost from the noise draw."""

        def add_(self, tensors, std) -> None:
            pass

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
        def step(batch) -> None:
            fn(encoder, batch, clipper=clipper, noise_multiplier=args.sigma, expected_batch_size=args.batch,
               optimizer=optimizer, loss=loss, noise=noise)

        return step

    steps = {"nonprivate": ours(nonprivate_step, None), "dp": ours(dp_step, GaussianNoise()),
             "dp_no_noise": ours(dp_step, NoNoise())}
    return encoder, steps, batches, (optimizer, loss, clipper, GaussianNoise())


def phases(args, encoder, batches, pieces) -> dict[str, dict[str, float]]:
    """Median seconds per phase of the non-private step and of the DP step (engine modes)."""
    from graphveil.engine.dp_step import batch_losses
    from graphveil.engine.per_tuple import PerTupleGrad

    optimizer, loss, clipper, noise = pieces
    params = list(encoder.trainable_parameters())
    out: dict[str, dict[str, list[float]]] = {}

    def timed(series: dict[str, list[float]], name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        synchronize(args.device)
        series.setdefault(name, []).append(time.perf_counter() - t0)
        return result

    engines = {"auto": PerTupleGrad(encoder, verify=False)}
    if args.materialize:
        engines["materialize"] = PerTupleGrad(encoder, mode="materialize", verify=False)
    for batch in batches[: args.phase_reps]:
        s = out.setdefault("nonprivate", {})
        optimizer.zero_grad(set_to_none=True)
        losses = timed(s, "forward", lambda b=batch: batch_losses(encoder, b, loss))
        timed(s, "backward", lambda x=losses: x.mean().backward())
        timed(s, "adam", optimizer.step)
        for mode, engine in engines.items():
            s = out.setdefault(f"dp_{mode}", {})
            optimizer.zero_grad(set_to_none=True)

            def forward(engine=engine, b=batch):
                with engine.record(num_groups=b.size):
                    return batch_losses(encoder, b, loss)

            losses = timed(s, "forward", forward)
            norms = timed(s, "backward+norms", lambda e=engine, x=losses: e.compute(x.sum()))
            timed(s, "clipped sums", lambda e=engine, b=batch, n=norms: e.accumulate(clipper.factors(b, n)))
            timed(s, "noise", lambda: noise.add_([p.grad for p in params], args.sigma * clipper.clip_norm))
            for p in params:
                p.grad.div_(args.batch)
            timed(s, "adam", optimizer.step)
    return {k: {name: statistics.median(v) for name, v in series.items()} for k, series in out.items()}


def worker(args: argparse.Namespace) -> dict:
    import torch

    encoder, steps, batches, pieces = setup(args)
    for batch in batches[: args.warmup]:
        for mode in MODES:
            steps[mode](batch)
    synchronize(args.device)
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    for i, batch in enumerate(batches[args.warmup :]):
        for mode in MODES[i % len(MODES) :] + MODES[: i % len(MODES)]:  # rotate the order
            t0 = time.perf_counter()
            steps[mode](batch)
            synchronize(args.device)
            wall[mode].append(time.perf_counter() - t0)
    ratios = {m: statistics.median(x / y for x, y in zip(wall[m], wall["nonprivate"], strict=True))
              for m in MODES[1:]}
    result = {
        "config": args.config,
        "trainable_params": sum(p.numel() for p in encoder.trainable_parameters()),
        "median_s": {m: statistics.median(wall[m]) for m in MODES},
        "paired_ratio": ratios,
        "loadavg": os.getloadavg()[0],
    }
    if args.config.endswith("-full"):
        result["phases_s"] = phases(args, encoder, batches[args.warmup :], pieces)
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
    parser.add_argument("--json", help="write the results here (one JSON) instead of appending to " + str(RESULTS.name))
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

    print(f"\nb={args.batch} tuples, k_neg={args.k_neg} ({args.batch * (2 + args.k_neg)} sequences/step), "
          f"max_length={args.max_length}, threads={args.threads}, {args.steps} timed steps/mode, "
          f"{os.cpu_count()} CPUs, {time.time() - started:.0f} s\n")
    print("| config | trainable | non-private s | DP s | DP / non-private | goal | DP without noise / non-private |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        t, x = r["median_s"], r["paired_ratio"]
        goal = GOAL[r["config"].rsplit("-", 1)[1]]
        print(f"| {r['config']} | {r['trainable_params'] / 1e6:.2f}M | {t['nonprivate']:.3f} | {t['dp']:.3f} | "
              f"**{x['dp']:.2f}×** | ≤ {goal}× | {x['dp_no_noise']:.2f}× |")
    for r in results:
        if "phases_s" not in r:
            continue
        print(f"\nphases of one step, {r['config']} (median s):\n")
        names = ["forward", "backward", "backward+norms", "clipped sums", "noise", "adam"]
        print("| step | " + " | ".join(names) + " | total |")
        print("|---|" + "---:|" * (len(names) + 1))
        for kind, ph in r["phases_s"].items():
            cells = [f"{ph[n]:.3f}" if n in ph else "" for n in names]
            print(f"| {kind} | " + " | ".join(cells) + f" | {sum(ph.values()):.3f} |")
    print("\nDP / non-private: median over steps of the paired ratio (same batch, back to back, order rotated). "
          "DP uses the default CSPRNG 4-sum noise; 'without noise' is the same step adding none (not private).")
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
