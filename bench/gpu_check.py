"""The GPU check (issue 28): CUDA tests and DP / non-private step ratios on one GPU, one JSON.

Run it through ``bench/gpu_check.sh`` (not part of CI). Where CUDA is present it, in this order
(the most useful first, so a check cut short by the time budget loses the least):

1. runs the CUDA tests (every test under ``tests/`` whose file mentions CUDA, selected by ``-k cuda``);
2. ``minilm_lora``: ``bench/dp_step_speed.py --device cuda`` — the packaged MiniLM + LoRA,
   b = 32 tuples, k_neg = 4: DP step and an Opacus per-sample step over the non-private step;
3. ``full_finetune``: ``bench/full_finetune_speed.py --device cuda`` — MiniLM and a random
   BERT-base (LoRA and full fine-tuning) and the decoder with LoRA (``hf_causal_lora`` on a
   random Llama of BERT-base's size; no decoder model is packaged), float32;
4. ``decoder_bf16``: the same decoder with its frozen base model and cache in bfloat16
   (``--dtype bfloat16``; bf16 "off" is the ``llama-lora`` row of 3);
5. ``gap_epoch``: GAP at edge level on Cora (``bench/gdp.py`` row 4, one seed), run twice with
   2 and 12 epochs of each stage, after a 2-epoch warm-up run; seconds per epoch = the
   difference / 10 (calibration and set-up cancel).

Measured steps end when the device's queued work does (``bench/_device.py``). bf16 is measured
where GraphVeil has a dtype option (the decoder); MiniLM / BERT (``hf_lora``) and the GNN methods
have none and run float32. The GNN methods have no device option either: GAP runs on the host's
CPU even on a GPU machine, and the JSON says so. Every item that does not run is listed under
``skipped`` with the reason; without CUDA that is every item, and the JSON says ``"cuda": false``.

Budget: the whole check stops by ``--budget`` seconds (default 450, inside the 8 minutes asked
for one H100); an item still running then is stopped and listed as skipped.

    bash bench/gpu_check.sh [--out bench/results/gpu_check.json] [--budget 450]

``--smoke``: the same items on the CPU at toy sizes (MiniLM and decoder LoRA only, one step,
tiny GAP runs) — checks the plumbing on a machine without CUDA; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
#: (name, what it measures) in the order they run
ITEMS = (
    ("cuda_tests", "the CUDA tests (pytest -k cuda over the test files that mention CUDA)"),
    ("minilm_lora", "DP / non-private (and Opacus / non-private) step, MiniLM + LoRA, on the GPU"),
    ("full_finetune", "DP / non-private step, MiniLM and BERT-base, LoRA and full fine-tuning, and the "
                      "decoder (hf_causal_lora, random Llama) with LoRA, float32, on the GPU"),
    ("decoder_bf16", "DP / non-private step, the decoder with LoRA, frozen base model and cache in bfloat16"),
    ("gap_epoch", "GAP (edge level, Cora) seconds per epoch of each stage"),
)
#: an item needs at least this much of the budget left to start
MIN_START_S = 20.0
#: not measured anywhere, with the reason
NEVER = (
    {"what": "bf16 for MiniLM / BERT (hf_lora) and GAP",
     "why": "no dtype option in hf_lora or the GNN methods: they run float32"},
)


class Check:
    """The JSON being built, the clock, and running one item's command within the budget."""

    def __init__(self, out: Path, budget: float, smoke: bool = False) -> None:
        self.out, self.budget, self.started = out, budget, time.monotonic()
        self.smoke, self.device = smoke, "cpu" if smoke else "cuda"
        self.report: dict[str, Any] = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "budget_s": budget, "measurements": {}, "skipped": [*NEVER]}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        print(f"[gpu-check {self.elapsed():5.0f} s] {text}", flush=True)

    def skip(self, what: str, why: str) -> None:
        self.report["skipped"].append({"what": what, "why": why})
        self.say(f"skipped {what}: {why}")

    def run(self, what: str, argv: list[str], cwd: Path = REPO) -> str | None:
        """Run ``argv`` (its own process group) with the budget left; its stdout, or ``None``
        after recording why it gave none."""
        left = self.budget - self.elapsed()
        if left < MIN_START_S:
            self.skip(what, f"time budget: {left:.0f} s of {self.budget:.0f} s left")
            return None
        self.say(f"{what}: {' '.join(Path(a).name if a.startswith('/') else a for a in argv)}")
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            self.skip(what, f"time budget: stopped after {left:.0f} s")
            return None
        if proc.returncode:
            self.skip(what, f"failed (exit {proc.returncode}): {stderr.strip()[-1500:]}")
            return None
        return stdout

    def write(self) -> None:
        self.report["seconds"] = round(self.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".partial")
        tmp.write_text(json.dumps(self.report, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.out)  # never a half-written JSON


def environment() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    env = {"cuda": cuda, "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "cuda_version": torch.version.cuda, "device_name": None,
           "loadavg_start": os.getloadavg()}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   device_memory_gib=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}",
                   cudnn=torch.backends.cudnn.version(), bf16_supported=torch.cuda.is_bf16_supported())
    return env


def cuda_test_files() -> list[str]:
    """Test files that use CUDA (the ones holding the ``needs a CUDA device`` tests)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                  if "torch.cuda" in p.read_text(encoding="utf-8", errors="replace"))


def cuda_tests(check: Check) -> None:
    files = cuda_test_files()
    if not files:
        check.skip("cuda_tests", "no test file mentions CUDA")
        return
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", "-rs", *files]
    left = check.budget - check.elapsed()
    check.say(f"cuda_tests: pytest -k cuda {' '.join(files)}")
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=max(left, 1.0), check=False)
    except subprocess.TimeoutExpired:
        check.skip("cuda_tests", f"time budget: stopped after {left:.0f} s")
        return
    tail = proc.stdout.strip().splitlines()[-15:]
    check.report["measurements"]["cuda_tests"] = {"files": files, "exit_code": proc.returncode, "summary": tail}
    check.say(f"cuda_tests: exit {proc.returncode}: {tail[-1] if tail else ''}")


def minilm_lora(check: Check, tmp: Path) -> None:
    out = tmp / "minilm_lora.json"
    sizes = ["--batch", "2", "--k-neg", "1", "--steps", "1", "--warmup", "1", "--entities", "300"] if check.smoke \
        else ["--batch", "32", "--k-neg", "4", "--steps", "20", "--warmup", "3"]
    argv = [sys.executable, str(BENCH / "dp_step_speed.py"), "--device", check.device, *sizes, "--no-memory",
            "--phase-reps", "1" if check.smoke else "4", "--json", str(out)]
    if (stdout := check.run("minilm_lora", argv)) is None:
        return
    print(stdout, flush=True)
    raw = json.loads(out.read_text())
    check.report["measurements"]["minilm_lora"] = {
        "device": check.device, "args": {k: raw["args"][k] for k in ("batch", "k_neg", "steps", "warmup", "micro_batch")},
        "paired_ratio": {m: t["paired_ratio"] for m, t in raw["timing"]["times"].items()},
        "median_s": {m: t["median_s"] for m, t in raw["timing"]["times"].items()},
        "trainable_params": raw["timing"]["trainable_params"], "phases_s": raw["timing"].get("phases_s")}


def full_finetune(check: Check, tmp: Path, name: str, configs: list[str], dtype: str) -> None:
    out = tmp / f"{name}.json"
    if check.smoke:
        configs = [c for c in configs if c in ("minilm-lora", "llama-lora")]
    sizes = ["--batch", "2", "--k-neg", "1", "--steps", "1", "--entities", "300"] if check.smoke \
        else ["--batch", "16", "--k-neg", "4", "--steps", "5"]
    argv = [sys.executable, str(BENCH / "full_finetune_speed.py"), "--device", check.device, "--dtype", dtype,
            "--configs", *configs, *sizes, "--warmup", "1", "--threads", str(min(8, os.cpu_count() or 1)),
            "--json", str(out)]
    if (stdout := check.run(name, argv)) is None:
        return
    print(stdout, flush=True)
    raw = json.loads(out.read_text())
    check.report["measurements"][name] = {
        "device": check.device, "dtype_of_decoder": dtype,
        "args": {k: raw["args"][k] for k in ("batch", "k_neg", "max_length", "steps", "warmup")},
        "configs": {r["config"]: {"trainable_params": r["trainable_params"], "paired_ratio": r["paired_ratio"],
                                  "median_s": r["median_s"], **({"phases_s": r["phases_s"]} if "phases_s" in r else {})}
                    for r in raw["results"]}}


def gap_epoch(check: Check, tmp: Path) -> None:
    seconds = {}
    few, more = (1, 2) if check.smoke else (2, 12)
    # the first run pays one-time costs (file caches, compiled modules): a warm-up, not counted
    for i, epochs in enumerate((few, few, more)):
        out = tmp / f"gap_{i}_{epochs}.jsonl"
        argv = [sys.executable, str(BENCH / "gdp.py"), "--rows", "4", "--seeds", "1", "--out", str(out),
                "--set", f"training.epochs={epochs}", "--set", f"method.encoder_training.epochs={epochs}"]
        if check.run("gap_epoch", argv, cwd=tmp) is None:
            return
        seconds["warm-up" if i == 0 else epochs] = json.loads(out.read_text().splitlines()[-1])["seconds"]
    check.report["measurements"]["gap_epoch"] = {
        "device": "cpu", "why_cpu": "GraphVeil's GNN methods have no device option: GAP runs on the host's CPU",
        "row": "edge ε=1 GAP, Cora, seed 0 (bench/gdp.py row 4)", "run_seconds": seconds,
        "seconds_per_epoch": (seconds[more] - seconds[few]) / (more - few)}
    check.say(f"gap_epoch: {(seconds[more] - seconds[few]) / (more - few):.3f} s per epoch of each stage (CPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "gpu_check.json")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (default 450)")
    parser.add_argument("--smoke", action="store_true",
                        help="the items on the CPU at toy sizes (plumbing check; numbers mean nothing)")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget must be > 0 seconds, got {args.budget}")
    check = Check(args.out, args.budget, args.smoke)
    check.report.update(environment(), smoke=args.smoke)
    env = check.report
    if not env["cuda"] and not args.smoke:
        check.say(f"no CUDA device (torch {env['torch']}, built for CUDA {env['cuda_version']}): nothing measured")
        for name, what in ITEMS:
            check.skip(name, f"no CUDA device: torch.cuda.is_available() is False ({what})")
    else:
        check.say(f"{env['device_name'] or 'smoke run on the CPU'}, torch {env['torch']}, CUDA {env['cuda_version']}")
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            cuda_tests(check)
            minilm_lora(check, Path(tmp))
            full_finetune(check, Path(tmp), "full_finetune",
                          ["minilm-lora", "minilm-full", "bert-base-lora", "bert-base-full", "llama-lora"], "float32")
            full_finetune(check, Path(tmp), "decoder_bf16", ["llama-lora"], "bfloat16")
            gap_epoch(check, Path(tmp))
    check.report["loadavg_end"] = os.getloadavg()
    check.write()
    check.say(f"wrote {args.out} ({len(check.report['measurements'])} measured, "
              f"{len(check.report['skipped'])} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
