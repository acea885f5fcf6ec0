#!/usr/bin/env bash
# H200: the measured-acceptance-length path and real speculative decoding (lossless check)
# at the benchmark shape (Qwen3-4B-shaped random target, 5-layer drafter, B=16).
# Runs with the device machine's python3 (torch 2.11+cu130, transformers 5.17); no network.
# Results: $OUT/h200_spec.json and $OUT/h200_spec.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/h200_spec}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true
PYTHONPATH=$PWD python3 -W ignore bench/h200_spec.py --out "$OUT" "$@" 2>&1 | tee "$OUT/h200_spec.log"
