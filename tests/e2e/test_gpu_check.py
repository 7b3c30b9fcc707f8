"""``bench/gpu_check.sh`` on a machine without CUDA (issue 28): it measures nothing, lists every
item as skipped with the reason, writes the JSON with ``"cuda": false`` and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _paths import REPO

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path; a GPU machine runs the check")

ITEMS = {"cuda_tests", "minilm_lora", "full_finetune", "decoder_bf16", "gap_epoch"}


def test_without_cuda_every_item_is_skipped_and_the_json_says_so(tmp_path):
    out = tmp_path / "nested" / "gpu_check.json"
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--out", str(out)],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["cuda"] is False and report["device_name"] is None
    assert report["torch"] == torch.__version__ and report["measurements"] == {}
    skipped = {s["what"]: s["why"] for s in report["skipped"]}
    assert ITEMS <= set(skipped)
    assert all("no CUDA device" in skipped[item] for item in ITEMS)
    for item in ITEMS:  # said on stdout too, not only in the file
        assert f"skipped {item}: no CUDA device" in proc.stdout
    assert not list(out.parent.glob("*.partial"))  # written whole


def test_a_bad_budget_argument_is_refused_with_nothing_written(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--out", str(out), "--budget", "soon"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and "--budget" in proc.stderr
    assert not out.exists()
