#!/usr/bin/env bash
# The GPU check (issue 28, point 4): on a machine with CUDA, runs the CUDA tests, then measures
# on the GPU the DP / non-private step ratio for MiniLM + LoRA, full fine-tuning and a decoder
# with LoRA (bf16 off and on), and the GAP epoch time; writes ONE JSON (device name, torch and
# CUDA versions, every measurement, what was skipped and why). Sized to finish within 8 minutes
# on one H100 (--budget, default 450 s). Without CUDA it measures nothing, says what it skipped,
# writes the JSON with "cuda": false and exits 0. Not part of CI. What each item runs:
# bench/gpu_check.py.
#
#   bash bench/gpu_check.sh [--out bench/results/gpu_check.json] [--budget 450]
#
# Python: $PYTHON if set, else the checkout's .venv, else python3 (GraphVeil installed with its
# dev extras: the CUDA tests need pytest). Nothing is downloaded: the models are the packaged
# MiniLM and random models built from their configs.
set -euo pipefail
bench="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$bench")"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$repo"
exec "$python" "$bench/gpu_check.py" "$@"
