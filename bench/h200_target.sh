#!/usr/bin/env bash
# The target's forward and the anchors' shape on ONE H200, in one device call (<= 560 s):
#   1. trainer.bench.target_forward at the Qwen3-4B shape (S=3072, micro-batch 4): eager vs
#      decoder layers compiled, under each sdpa kernel, side by side;
#   2. trainer.bench --target-compile at the same shape: the drafter step with the target
#      eager and compiled, end to end both ways (flex-compiled variant);
#   3. trainer.bench at SpecForge's published shape (Qwen3-8B target, 5-layer drafter,
#      seq 768, 256 anchors, block 16), eager and compiled target.
#   OUT=/some/dir bash bench/h200_target.sh             # on the device: python3, torch, no network
#   OUT=/tmp/t bash bench/h200_target.sh --cpu-smoke    # tiny CPU version (checks the script)
# Files in $OUT: target.log (everything), target_4b.json, bench_4b.json, bench_8b.json.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/h200_target}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/dfo-target.XXXXXX)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/ind
part() {   # part CAP_S CMD...
  local cap=$1; shift
  echo "== $* (limit ${cap} s, at ${SECONDS} s)"
  timeout -k 10 "$cap" "$@"
  echo "== exit $? at ${SECONDS} s"
}
{
  echo "date: $(date -u +%FT%TZ)  git: $(git rev-parse --short HEAD 2>/dev/null || echo -)"
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")'
  if [ "${1:-}" = "--cpu-smoke" ]; then
    part 300 "$PY" -m trainer.bench.target_forward --quick --cpu --variants eager,compiled --json "$OUT/target_4b.json"
    part 300 "$PY" -m trainer.bench --quick --cpu --variants sdpa --target-compile --json "$OUT/bench_4b.json"
  else
    part 200 "$PY" -m trainer.bench.target_forward --variants eager,eager-flash,eager-cudnn,compiled,compiled-cudnn,compiled-flash \
      --json "$OUT/target_4b.json"
    part 170 "$PY" -m trainer.bench --variants flex-compiled --target-compile --iters 8 --warmup 2 \
      --json "$OUT/bench_4b.json"
    part 160 "$PY" -m trainer.bench --target qwen3-8b --seq-len 768 --anchors 256 --micro-batch 16 \
      --variants flex-compiled --target-compile --iters 8 --warmup 2 --json "$OUT/bench_8b.json"
  fi
  echo "total ${SECONDS} s"
} 2>&1 | tee "$OUT/target.log"
rm -rf "$W"
