#!/usr/bin/env bash
# GPU run for ddp scaling: ddp 1 -> 2 (-> 4, -> 8) GPUs on the Qwen3-1.7B-shaped target,
# 5-layer drafter, S=2048, 256 anchors, micro-batch 1, flex + compile (bench/bench_ddp.py).
# One device call (the driver stops itself before 540 s): worlds 1, 2 and, where the machine
# has them, 4 and 8; settings: accumulation 1 and 4 (weak scaling), fp32 and bf16 all-reduce,
# DDP buckets 25 and 100 MB.
#
#   bash bench/h200_ddp.sh          # on the device machine: python3 (torch 2.11), writes $OUT
#   SMOKE=1 GRAD_DTYPES=fp32 OUT=/tmp/ddp bash bench/h200_ddp.sh    # CPU dry run (tiny shape)
#
# Files back in $OUT (3): ddp.log (everything printed, GPU topology first), ddp.json (the
# summary: rows with s/step, samples/s, efficiency; per-world runs), env.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/dfo_ddp_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
n=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
{ python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
  transformers.__version__, "gpus", torch.cuda.device_count())'
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  nvidia-smi topo -m; git log -1 --format='commit %H' 2>/dev/null; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" > "$OUT/ddp.log"
smoke=()  # SMOKE=1: the tiny CPU shape, worlds 1,2 (a dry run of this script on any machine)
if [ "${SMOKE:-0}" = 1 ]; then smoke=(--cpu-smoke); n=2; fi
worlds=1
for w in 2 4 8; do [ "$n" -ge "$w" ] && worlds="$worlds,$w"; done
k=$(( $(echo "$worlds" | tr ',' '\n' | wc -l) ))
budget=$(( ${TOTAL_S:-520} - ($(date +%s) - t0) ))
per=$(( budget / k ))
echo "gpus $n worlds $worlds: $per s per world" | tee -a "$OUT/ddp.log"
python3 bench/bench_ddp.py --worlds "$worlds" --out "$OUT/ddp.json" --timeout-s "$per" \
    --accums "${ACCUMS:-1,4}" --grad-dtypes "${GRAD_DTYPES:-fp32,bf16}" \
    --buckets-mb "${BUCKETS_MB:-25,100}" ${smoke[@]+"${smoke[@]}"} 2>&1 | tee -a "$OUT/ddp.log"
rc=${PIPESTATUS[0]}
echo "bench_ddp exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/ddp.log"
exit "$rc"
