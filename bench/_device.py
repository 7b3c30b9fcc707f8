"""Where a step benchmark runs: ``--device`` for ``bench/dp_step_speed.py`` and
``bench/full_finetune_speed.py`` (and ``bench/gpu_check.py``, which runs them on CUDA).

Honoured all the way: the encoder's trainable and frozen modules and its ``device`` attribute
(the cached frozen states stay in CPU memory and each batch's rows move to the device, as in
a run), the batches' index tensors, and so the scores, losses, per-tuple gradients, clipped sums
and the noise (:mod:`graphveil.engine.noise` draws it on the gradient's device).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu",
                        help="torch device of the model, batches and noise: 'cpu' (default), 'cuda' or 'cuda:N'")


def device(name: str) -> Any:
    """``torch.device(name)``, refusing CUDA on a machine without it (a clear message, not a
    failure deep inside the first step)."""
    import torch

    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return dev


def place(encoder: Any, name: str) -> Any:
    """Move a (``hf_lora`` / ``hf_causal_lora``) encoder to ``name`` before ``prepare``: its modules
    and its ``device`` (where ``cached_inputs`` sends each batch's rows)."""
    dev = device(name)
    encoder.to(dev)
    encoder.device = dev
    return encoder


def batches_to(batches: list[Any], name: str) -> list[Any]:
    """The same tuple batches with their index tensors on ``name``."""
    from graphveil.contract.sampler import TupleBatch

    dev = device(name)
    return [TupleBatch(b.positives.to(dev), b.negatives.to(dev), b.anchors.to(dev)) for b in batches]


def synchronize(name: str) -> None:
    """Wait for the device's queued work (a CUDA step's wall time ends when its kernels do)."""
    import torch

    if torch.device(name).type == "cuda":
        torch.cuda.synchronize(torch.device(name))
