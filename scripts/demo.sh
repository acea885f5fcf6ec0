#!/usr/bin/env bash
# The main job (README), on the embedded `local` default: no host, no GPU needed.
#   dfo deploy      a hash-locked uv env (profile cpu-pypi: PyPI alone) under ~/.dfo/envs/
#   demo assets     a tiny random-init Qwen3 target + synthetic data under ~/.dfo/demo/
#   dfo warm-cache  the compile-cache snapshot for this env, restored or warmed
#   dfo launch -f   the DFlash trainer under the supervisor, with torch's FX-tracing error of
#                   the threaded lazy-compile race (docs/recovery.md) injected once:
#                   detection, fallback and resume, then done
#   then a recap of the run (failure, fallback, checkpoint resumed, time lost, acceptance
#   length) and the commands to try next; each step says how long it usually takes
# Needs Python >= 3.11 and HTTPS access to PyPI (about 2.6 GiB of downloads the first time).
# It links dfo onto PATH (/usr/local/bin/dfo as root, else ~/.local/bin/dfo) so the README's
# commands work as typed in any new shell.
# Extra arguments go to `dfo demo` (e.g. --no-fault, --host NAME).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=$(command -v python3.11 || command -v python3 || true)
if [[ -z $PY ]] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
    echo "scripts/demo.sh: needs Python >= 3.11 on PATH" >&2
    exit 2
fi
if [[ ! -x .venv/bin/dfo ]]; then
    echo "== setting up .venv (the local side: click, rich, pyyaml, paramiko, uv)" >&2
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -e .
fi
# dfo onto PATH, so the README's commands work as typed in a new shell: a link in
# /usr/local/bin (root) or ~/.local/bin; a file there that is not a link is left alone
bin=$([[ $EUID -eq 0 ]] && echo /usr/local/bin || echo "$HOME/.local/bin")
dfo=$PWD/.venv/bin/dfo
if [[ -e $bin/dfo && ! -L $bin/dfo ]]; then
    echo "== $bin/dfo is not this checkout's and stays; this checkout's dfo is $dfo" >&2
elif mkdir -p "$bin" && ln -sfn "$dfo" "$bin/dfo"; then
    echo "== dfo linked at $bin/dfo (-> $dfo)" >&2
    case ":$PATH:" in
        *":$bin:"*) ;;
        *) echo "   $bin is not on PATH; in a new shell: export PATH=\"$bin:\$PATH\"" >&2 ;;
    esac
fi
exec .venv/bin/dfo demo "$@"
