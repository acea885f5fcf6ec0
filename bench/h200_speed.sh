#!/usr/bin/env bash
# MFU, recovery and warm start on ONE H200 in one device call (<= 540 s), side by side.
#   1. trainer.bench: the flex-compiled drafter step (Qwen3-4B shape, S=3072, 512 anchors,
#      B=16) and the MFU candidates (--candidates), each after the other in one process;
#      the JSON is rewritten after each, so a part cut short keeps what it measured.
#   2. bench_cache.py --device cuda: cold vs restored-snapshot warm-up, with fxgraph and
#      AOT-autograd cache hit/miss/bypass per shape and the bypass reasons.
#   3. bench_recovery.py: threads layout, 3 drafter threads on cuda:0, gate off, torch's FX
#      error injected at step 5 -> the supervisor's compile_gate retry; attempt 2's warm-up
#      cache counters and failure -> healthy.
#   4. trainer.bench --check (flex vs sdpa agreement), if time is left.
# Every part has its own timeout and the whole is bounded by TOTAL_S (default 530).
#
#   OUT=/some/dir bash bench/h200_speed.sh               # on the device: python3, torch 2.11, no network
#   PARTS=recovery,trainer-bench CANDS=cdt,mb4+cdt OUT=... bash bench/h200_speed.sh   # some parts only
#   PARTS=recovery,recovery-packed REC_S=170 OUT=... bash bench/h200_speed.sh   # recovery, bucketed vs packed
#   OUT=/tmp/speed bash bench/h200_speed.sh --cpu-smoke   # tiny CPU version of every part (checks the script)
#
# Files in $OUT (7): speed.log (everything printed), summary.txt (one line per part),
# trainer_bench.json, cache.json (bench_cache's BENCH line), recovery_summary.json,
# recovery-packed_summary.json (the same recovery on packed rows),
# extra.tar.gz (the parts' logs, the recovery run's attempt logs and events).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-/tmp/h200_speed}
MODE=gpu
[ "${1:-}" = "--cpu-smoke" ] && MODE=cpu
PY=${PYTHON:-python3}
if [ "$MODE" = cpu ]; then TOTAL=${TOTAL_S:-3000}; else TOTAL=${TOTAL_S:-530}; fi
W=$(mktemp -d /tmp/dfo-speed.XXXXXX)
mkdir -p "$OUT" "$W/logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
: > "$OUT/summary.txt"

PARTS=${PARTS:-trainer-bench,cache-bench,recovery,recovery-packed,check}
CANDS=${CANDS:-mb1,mb2,cdt,gemm}
TB_S=${TB_S:-210}

# part NAME CAP_S LOGFILE CMD...: CMD under a timeout of min(CAP_S, what is left - 15 s)
part() {
  local name=$1 cap=$2 log=$3; shift 3
  case ",$PARTS," in *",$name,"*) ;; *) echo "== $name: not asked for (PARTS=$PARTS)"; return 0 ;; esac
  local left=$(( TOTAL - SECONDS - 15 ))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 25 ]; then
    echo "== $name: skipped (${left} s left)" | tee -a "$OUT/summary.txt"; return 0
  fi
  echo "== $name (limit ${cap} s, start at ${SECONDS} s): $*"
  local t0=$SECONDS
  timeout -k 10 "$cap" "$@" > >(tee "$log") 2>&1
  local rc=$?
  sleep 0.2
  echo "== $name: exit $rc in $(( SECONDS - t0 )) s" | tee -a "$OUT/summary.txt"
}

{
  echo "date: $(date -u +%FT%TZ)  git: $(git rev-parse --short HEAD 2>/dev/null || echo -)  mode: $MODE"
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "transformers", transformers.__version__)'
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null || true

  # 1. MFU: baseline + candidates (most likely wins first; compile-heavy ones last)
  if [ "$MODE" = cpu ]; then
    part trainer-bench 900 "$W/logs/trainer_bench.log" env TORCHINDUCTOR_CACHE_DIR="$W/ind-bench" \
      "$PY" -m trainer.bench --quick --cpu --variants sdpa --candidate-variant sdpa \
      --candidates mb2,ce4096,cudagraphs --iters 1 --warmup 1 --budget-s 600 --json "$OUT/trainer_bench.json"
  else
    part trainer-bench "$TB_S" "$W/logs/trainer_bench.log" env TORCHINDUCTOR_CACHE_DIR="$W/ind-bench" \
      "$PY" -m trainer.bench --variants flex-compiled --iters 10 --warmup 2 \
      --candidates "$CANDS" --budget-s $(( TB_S - 70 )) \
      --json "$OUT/trainer_bench.json"
  fi

  # 2. cold vs restored snapshot (own cache dirs under its workdir)
  if [ "$MODE" = cpu ]; then
    part cache-bench 900 "$W/logs/cache_bench.log" "$PY" bench/bench_cache.py --budget 880 --workdir "$W/cache"
  else
    part cache-bench 140 "$W/logs/cache_bench.log" "$PY" bench/bench_cache.py --device cuda --budget 130 \
      --workdir "$W/cache"
  fi
  grep '^BENCH ' "$W/logs/cache_bench.log" 2>/dev/null | tail -1 | cut -c7- > "$OUT/cache.json"

  # 3. recovery under the supervisor, bucketed then packed rows (what is left, at most REC_S
  #    each; the bench stops its run itself)
  recovery() {  # NAME OUTDIR [--pack]
    local name=$1 dir=$2; shift 2
    rest=$(( TOTAL - SECONDS - 25 ))
    [ "$MODE" = gpu ] && [ "$rest" -gt "${REC_S:-170}" ] && rest=${REC_S:-170}
    if [ "$MODE" = cpu ]; then
      part "$name" $(( rest + 10 )) "$W/logs/$name.log" "$PY" bench/bench_recovery.py --cpu-smoke \
        --out "$dir" --inject fx_race@3 --steps 6 --total-s $(( rest - 25 )) --stop-timeout 15 \
        --warmup-s 600 "$@"
    else
      part "$name" $(( rest + 10 )) "$W/logs/$name.log" "$PY" bench/bench_recovery.py --out "$dir" \
        --inject fx_race@5 --steps 20 --total-s $(( rest - 25 )) --stop-timeout 15 \
        --warmup-s 150 --train-s 60 "$@"
    fi
    cp "$dir/summary.json" "$OUT/${name}_summary.json" 2>/dev/null || echo "(no $name summary)"
  }
  recovery recovery "$W/rec"
  recovery recovery-packed "$W/rec-packed" --pack

  # 4. flex vs sdpa agreement (CUDA only)
  if [ "$MODE" = gpu ]; then
    part check 60 "$W/logs/check.log" "$PY" -m trainer.bench --check
  fi
  echo "total ${SECONDS} s"
} 2>&1 | tee "$OUT/speed.log"

# the figures, after the exit codes in summary.txt
{
  echo "-- figures"
  grep -h '^bench: ' "$W/logs/trainer_bench.log" 2>/dev/null
  grep -h -e '^warm-up (trainer' -e '^autograd cache bypassed' -e '^process wall' \
    -e '^cpu ' -e '^cuda' "$W/logs/cache_bench.log" 2>/dev/null
  for name in recovery recovery-packed; do
    [ -f "$W/logs/$name.log" ] || continue
    echo "$name:"
    grep -h -e '^run recovery' -e '^| [0-9]' -e '^attempt [0-9] warm-up' -e '^attempt [0-9] startup' \
      -e '^standby: ' "$W/logs/$name.log"
  done
  grep -h '"ok"' "$W/logs/check.log" 2>/dev/null
} >> "$OUT/summary.txt"

# the rest, in one file: part logs, the recovery run's attempt logs, events, state
for rec in rec rec-packed; do
  run=$(find "$W/$rec/root/runs" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | head -1)
  mkdir -p "$W/logs/$rec-run"
  if [ -n "$run" ]; then
    for f in "$run"/attempt-*.log "$run"/events.jsonl "$run"/state.json "$run"/spec.json; do
      [ -f "$f" ] && tail -c 3000000 "$f" > "$W/logs/$rec-run/$(basename "$f")"
    done
  fi
done
tar -czf "$OUT/extra.tar.gz" -C "$W" logs 2>/dev/null
rm -rf "$W"
cat "$OUT/summary.txt"
