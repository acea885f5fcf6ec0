#!/usr/bin/env bash
# The test command (README): from a clean clone on a fresh Debian 12 machine, as root:
#   1. apt-get install what the lab of real parts needs (only what is missing);
#   2. a venv (.venv, Python 3.11 from PATH) holding tests/env/requirements.lock (hash-pinned:
#      dfo's `trainer` and `dev` extras) and dfo itself; torch's +cpu wheel from
#      $PIP_FIND_LINKS (e.g. /opt/wheels), else fetched once from PyTorch's CPU index;
#   3. the README's test command, `python -m pytest -q`, with CI=true so that a
#      lab that cannot come up fails instead of skipping; on two xdist workers
#      (`-n 2 --dist loadgroup`: the lab tests on one lane, each other file on
#      either; DFO_TEST_WORKERS=0 runs it in one process) and `--durations=25`,
#      so every run shows where its time went (docs/testing.md).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not lab"`, `scripts/test.sh tests/test_lab_node.py`).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CI="${CI:-true}"
export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '\n== %s\n' "$*" >&2; }

# --- 1. system packages ------------------------------------------------------
APT_PACKAGES=(openssh-server openssh-client lxc lxc-templates debootstrap distro-info rsync iproute2
              ca-certificates shellcheck tmux)
if [[ $(id -u) -ne 0 ]]; then
    echo "scripts/test.sh: needs root (the lab runs sshd for root and LXC containers)" >&2
    exit 2
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- 2. the venv ---------------------------------------------------------------
PY=$(command -v python3.11 || command -v python3 || true)
if [[ -z $PY ]] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
    echo "scripts/test.sh: needs Python >= 3.11 on PATH (python3.11)" >&2
    exit 2
fi
if [[ ! -x .venv/bin/python ]]; then
    log "venv with $PY"
    if ! "$PY" -m venv .venv 2>/dev/null; then
        # Debian's system python needs the venv package for ensurepip
        rm -rf .venv
        apt-get install -y -q "python3.11-venv"
        "$PY" -m venv .venv
    fi
fi
if [[ -z ${PIP_FIND_LINKS:-} && -d /opt/wheels ]]; then
    export PIP_FIND_LINKS=/opt/wheels   # the CPU torch wheel on this kind of machine
fi
# The test env is tests/env/requirements.lock: every package pinned and hashed, so a release
# on PyPI never changes it. torch's +cpu build is not on PyPI: it comes from a find-links
# directory, or is fetched once from PyTorch's CPU index into a cache (checked against the
# lock's hash). The lab's containers deploy the `cpu` profile offline from the same wheel.
LOCK=tests/env/requirements.lock
torch_cpu=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
torch_url="https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
found=
for d in ${PIP_FIND_LINKS//,/ }; do   # whitespace or comma separated, as dfo reads it
    [[ $d == *://* || -f $d/$torch_cpu ]] && found=1
done
if [[ -z $found ]]; then
    cache="${DFO_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dfo/wheels}"
    if [[ ! -f $cache/$torch_cpu ]]; then
        log "fetching $torch_cpu from PyTorch's CPU index into $cache (once; PyPI does not serve it)"
        want=$(grep -A1 "^torch==2.13.0+cpu " "$LOCK" | sed -n 's/.*--hash=sha256:\([0-9a-f]*\).*/\1/p')
        if ! "$PY" scripts/fetch_wheel.py "${DFO_TORCH_CPU_URL:-$torch_url}" "$cache" "$torch_cpu" "$want" >/dev/null
        then
            echo "scripts/test.sh: could not fetch ${DFO_TORCH_CPU_URL:-$torch_url}; place $torch_cpu in a directory and name it in PIP_FIND_LINKS (README)" >&2
            exit 2
        fi
    fi
    export PIP_FIND_LINKS="$cache${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"   # pip splits on whitespace
fi
# install the lock once per lock (a stamp in the venv holds its sha256), then dfo itself
# without dependencies and without build isolation (setuptools and wheel are in the lock)
REFERENCE=tests/env/reference.txt   # z-lab's own model classes, for the parity tests
lock_sha=$(cat "$LOCK" "$REFERENCE" | sha256sum | cut -d' ' -f1)
if [[ $(cat .venv/.dfo-test-lock 2>/dev/null) != "$lock_sha" ]]; then
    log "pip install --require-hashes -r $LOCK -r $REFERENCE"
    .venv/bin/python -m pip install -q --require-hashes --no-deps -r "$LOCK"
    .venv/bin/python -m pip install -q --require-hashes --no-deps -r "$REFERENCE"
    echo "$lock_sha" >.venv/.dfo-test-lock
fi
log "pip install --no-deps -e ."
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .

# --- 3. the tests (the README's command) --------------------------------------
workers=${DFO_TEST_WORKERS:-2}
lanes=()
if [[ $workers != 0 ]]; then
    lanes=(-n "$workers" --dist loadgroup)
fi
df -h / /tmp /var/lib >&2 || true   # the run needs about 20 GB free (README); the log shows what it had
log "python -m pytest -q ${lanes[*]} --durations=25 $*"
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -q "${lanes[@]}" --durations=25 "$@"
