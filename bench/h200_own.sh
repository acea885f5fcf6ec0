#!/usr/bin/env bash
# GPU run for your own trainer (one H200): dfo supervising your own trainer, `dfo launch -- CMD`.
# The script (bench/own_flex_threads.py) runs THREADS threads, each lazily compiling
# flex_attention forward+backward for new shapes on a cold compile cache; the supervisor
# watches only its output (--step-pattern) and its process tree's CPU time, and applies the
# run file's ladder (single-threaded warm-up first, then --threads 1). Records detection and
# recovery timings.
#
#   bash bench/h200_own.sh            # on the device machine: python3 (torch 2.11), writes $OUT
#
# Files back in $OUT: own.log (everything printed), summary.json (attempts, classes, timings,
# events), events.jsonl, attempt-N.log (up to 4), own.yaml (the run file used).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/dfo_own_out}
THREADS=${THREADS:-4}
TOTAL_S=${TOTAL_S:-480}
work=/tmp/dfo_own_work
rm -rf "$work"
mkdir -p "$OUT" "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tee "$OUT/own.log"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee -a "$OUT/own.log"
python3 bench/bench_own.py --out "$work" --threads "$THREADS" --total-s "$TOTAL_S" 2>&1 \
    | tee -a "$OUT/own.log"
rc=${PIPESTATUS[0]}
cp "$work/summary.json" "$work/own.yaml" "$OUT/" 2>/dev/null
run=""
for d in "$work"/root/runs/*; do [ -d "$d" ] && run=$d && break; done
if [ -n "$run" ]; then
  cp "$run/events.jsonl" "$OUT/" 2>/dev/null
  for n in 1 2 3 4; do
    [ -f "$run/attempt-$n.log" ] && tail -c 4000000 "$run/attempt-$n.log" > "$OUT/attempt-$n.log"
  done
fi
echo "bench_own exit $rc" | tee -a "$OUT/own.log"
exit "$rc"
