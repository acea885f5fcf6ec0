#!/usr/bin/env bash
# GPU run for multi-node groups (one machine with 2 H200s): two "nodes" (two local roots, one GPU
# each, rendezvous on loopback) against one node, same config (bench/bench_group.py).
#
#   bash bench/h200_group.sh          # on the device machine: python3 (torch 2.11), writes $OUT
#
# Files back in $OUT: group.log (everything printed), summary.json, and each run's
# events.jsonl / supervisor.log / attempt logs (tails) per node.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/dfo_group_out}
STEPS=${STEPS:-60}
work=/tmp/dfo_group_work
rm -rf "$work"
mkdir -p "$OUT" "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())' \
    2>&1 | tee "$OUT/group.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee -a "$OUT/group.log"
python3 bench/bench_group.py --out "$work" --steps "$STEPS" --total-s "${TOTAL_S:-540}" 2>&1 | tee -a "$OUT/group.log"
rc=${PIPESTATUS[0]}
cp "$work/summary.json" "$OUT/" 2>/dev/null
for node in a b; do
  for d in "$work/$node"/runs/*; do
    [ -d "$d" ] || continue
    dst="$OUT/$node-$(basename "$d")"
    mkdir -p "$dst"
    cp "$d/events.jsonl" "$d/state.json" "$d/spec.json" "$dst/" 2>/dev/null
    tail -c 200000 "$d/supervisor.log" > "$dst/supervisor.log" 2>/dev/null
    for f in "$d"/attempt-*.log; do [ -f "$f" ] && tail -c 1000000 "$f" > "$dst/$(basename "$f")"; done
  done
done
echo "bench_group exit $rc" | tee -a "$OUT/group.log"
exit "$rc"
