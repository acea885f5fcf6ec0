#!/usr/bin/env bash
# On a GPU machine (the H200 device machine): `dfo hosts check` on the local transport with
# the gpu-cu130 profile, the raw output of each GPU probe, and the gpu-cu130 verification
# probe (with its flex_attention smoke test) against this machine's own python3. No network,
# no uv, no paramiko needed. Results go to $OUT (default ./h200-out).
#   OUT=/tmp/out bash bench/h200_hostcheck.sh
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT/raw"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
ROOT=$(mktemp -d /tmp/dfo-h200.XXXXXX)

{ echo "date: $(date -u +%FT%TZ)"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo -)"
  "$PY" -c 'import sys,torch,transformers; print(sys.version.split()[0], torch.__version__, torch.version.git_version, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(), transformers.__version__)'
} > "$OUT/env.txt" 2>&1

for prof in gpu-cu130 gpu-cu128 cpu; do
  cat > "$OUT/hosts-$prof.yaml" <<YAML
default: h200
hosts:
  h200:
    transport: local
    root: $ROOT
    profile: $prof
    python: $(command -v "$PY")
YAML
  "$PY" -c 'import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))' \
    --hosts "$OUT/hosts-$prof.yaml" hosts check --json > "$OUT/hosts-check-$prof.json" 2> "$OUT/hosts-check-$prof.err"
  echo "hosts check --json ($prof): exit $?" >> "$OUT/summary.txt"
done
COLUMNS=160 "$PY" -c 'import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))' \
  --hosts "$OUT/hosts-gpu-cu130.yaml" hosts check > "$OUT/hosts-check-gpu-cu130.txt" 2>&1
echo "hosts check table (gpu-cu130): exit $?" >> "$OUT/summary.txt"

# the raw output of each GPU probe (new fixtures for tests/fixtures/gpu/h200)
"$PY" - "$OUT/raw" <<'PYEOF' > "$OUT/raw/probes.log" 2>&1
import subprocess, sys
from pathlib import Path
from orchestrator.plan import gpu
out = Path(sys.argv[1])
for p in (gpu.query_probe(), gpu.smi_probe(), gpu.apps_probe(), gpu.driver_probe(), gpu.devnodes_probe(),
          gpu.shm_probe(), gpu.memlock_probe()):
    r = subprocess.run(list(p.argv), capture_output=True, timeout=120)
    (out / f"{p.name}.stdout").write_bytes(r.stdout)
    (out / f"{p.name}.stderr").write_bytes(r.stderr)
    print(p.name, "exit", r.returncode, "->", p.parse(type("R", (), {"exit_code": r.returncode, "stdout": r.stdout, "stderr": r.stderr})()))
PYEOF
echo "raw probes: exit $?" >> "$OUT/summary.txt"

# the verification probe of gpu-cu130 against this python3 (transformers differs from the pin:
# expect exit 1 with one mismatch line, not a crash)
TORCHINDUCTOR_CACHE_DIR=$ROOT/inductor timeout 900 "$PY" tools/probe_env.py --python "$(command -v "$PY")" \
  --profile gpu-cu130 > "$OUT/probe-gpu-cu130.txt" 2>&1
echo "probe_env gpu-cu130: exit $? (1 = mismatches listed)" >> "$OUT/summary.txt"

# the GPU probe unit tests, if pytest is there
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_probes.py tests/test_gpu_env_probe.py \
    tests/test_gpu_lock.py > "$OUT/pytest.txt" 2>&1
  echo "pytest gpu tests: exit $?" >> "$OUT/summary.txt"
fi
rm -rf "$ROOT"
cat "$OUT/summary.txt"
