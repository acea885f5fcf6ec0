#!/usr/bin/env bash
# Warm start against cold (aim: a fifth of cold), on ONE H200 in one device call (<= ~250 s):
# bench/bench_cache.py --device cuda --variants all, each variant in a fresh process:
#   cold                 empty cache, compile.precompile off (the bench's definition), snapshot
#   restored             that snapshot restored, warm-up on a run copy
#   cold+precompile      compile.precompile on (its own cache key), its cache SEEDED with a copy
#                        of cold's (inductor/triton hit; AOT autograd and dynamo run, entries
#                        saved): not a cold start, never used as one
#   restored+precompile  that snapshot restored: dynamo loads its traced code, no re-trace
# and the ratios restored/cold and restored+precompile/cold, with per-shape counters and
# compile phases (dynamo trace, AOT, inductor load, precompile load) and build_models.
#
#   OUT=/some/dir bash bench/h200_warm.sh              # on the device: python3, torch 2.11, no network
#   OUT=/tmp/warm bash bench/h200_warm.sh --cpu-smoke   # the same on CPU (checks the script)
#
# Files in $OUT (<= 5): warm.log (everything printed), warm.json (the BENCH line),
# report-restored.json and report-restored-precompile.json (the restored warm-ups' own
# reports: per-shape phases, build_models_s, precompile_check), summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/h200_warm}
PY=${PYTHON:-python3}
DEV=cuda; BUDGET=${BUDGET_S:-235}
if [ "${1:-}" = "--cpu-smoke" ]; then DEV=cpu; BUDGET=${BUDGET_S:-1500}; fi
W=$(mktemp -d /tmp/dfo-warm.XXXXXX)
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{
  echo "date: $(date -u +%FT%TZ)  git: $(git rev-parse --short HEAD 2>/dev/null || echo -)  device: $DEV"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
  timeout -k 10 $(( BUDGET + 15 )) "$PY" bench/bench_cache.py --device "$DEV" --variants all \
    --precompile-cold seeded --budget "$BUDGET" --workdir "$W"
  echo "bench_cache exit $?"
} 2>&1 | tee "$OUT/warm.log"
grep '^BENCH ' "$OUT/warm.log" | tail -1 | cut -c7- > "$OUT/warm.json"
for v in restored restored-precompile; do
  [ -f "$W/root/runs/$v/report.json" ] && cp "$W/root/runs/$v/report.json" "$OUT/report-$v.json"
done
grep -E '^(-- |ratio |bench_cache exit)' "$OUT/warm.log" > "$OUT/summary.txt"
rm -rf "$W"
