"""Argv rendering at each nesting level. Pure: no processes, no network.

The levels a command passes through::

    local argv --shlex.join--> the remote login shell (ssh: one string)
               --> pct exec VMID --keep-env 0 -- ARGV (no shell: lxc-attach execs it)
               --> env [-C DIR] -- K=V ... ARGV        (env/cwd without a shell)
               --> sh -c 'CONSTANT SCRIPT' sh "$1" ... (only where a shell is needed;
                                                       values are positional parameters)

Nothing here builds a shell string from values except through ``shlex``; the only
shell scripts are the constants below, which take their values as ``"$1"``...
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping, Sequence

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Run "$@" (used when argv[0] contains '=', which ``env`` would take for an assignment).
EXEC_SCRIPT = 'exec "$@"'

#: The default environment inside a Proxmox container. ``pct exec --keep-env 0`` clears the
#: node's environment (it would otherwise leak the node's PATH, SSH_* and locale into the
#: container), so dfo passes the little a command needs explicitly.
CONTAINER_ENV: dict[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}

#: Atomic write from stdin: "$1" path, "$2" octal mode or "", "$3" expected byte count.
#: Writes a temporary name beside the target, checks the size (a dropped connection gives
#: cat an early EOF; a short file must never be renamed into place), then renames.
PUT_SCRIPT = r'''set -e
dir=$(dirname -- "$1"); base=$(basename -- "$1")
mkdir -p -- "$dir"
tmp="$dir/.$base.dfo-tmp.$$"
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
size=$(wc -c < "$tmp" | tr -d ' ')
if [ "$size" != "$3" ]; then
  echo "dfo put: $1: got $size of $3 bytes; not written" >&2
  exit 1
fi
if [ -n "$2" ]; then chmod -- "$2" "$tmp"; fi
sync -- "$tmp" 2>/dev/null || :
mv -fT -- "$tmp" "$1"
trap - EXIT
'''


def check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """Validate an argv: a non-empty sequence of strings without NUL bytes."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of strings, not a single string")
    out = tuple(argv)
    if not out:
        raise ValueError("argv must not be empty")
    for a in out:
        if not isinstance(a, str):
            raise TypeError(f"argv items must be str, got {type(a).__name__}: {a!r}")
        if "\0" in a:
            raise ValueError(f"argv items cannot hold NUL bytes: {a!r}")
    return out


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (env or {}).items():
        if not isinstance(k, str) or not _ENV_NAME_RE.match(k):
            raise ValueError(f"bad environment variable name {k!r}")
        if not isinstance(v, str) or "\0" in v:
            raise ValueError(f"bad value for environment variable {k}: {v!r}")
        out[k] = v
    return out


def quote(word: str) -> str:
    """shlex.quote, but a word holding '=' is always quoted so a shell never reads it
    as an assignment (``'A=1' cmd`` runs cmd ``A=1``; unquoted it would set A)."""
    q = shlex.quote(word)
    if q == word and "=" in word:
        return "'" + word + "'"
    return q


def shell_join(argv: Sequence[str]) -> str:
    """One string a POSIX shell splits back into exactly ``argv`` and evaluates nothing in."""
    return " ".join(quote(a) for a in check_argv(argv))


def with_env_cwd(argv: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> list[str]:
    """``argv`` wrapped so the far side applies env and cwd without a shell:
    ``env [-C DIR] -- K=V ... ARGV`` (GNU env; ``--`` ends env's options, then come the
    assignments, then the command). Returned unchanged when there is nothing to apply."""
    argv = check_argv(argv)
    env = check_env(env)
    if not env and cwd is None:
        return list(argv)
    out = ["env"]
    if cwd is not None:
        if not cwd or "\0" in cwd:
            raise ValueError(f"bad cwd {cwd!r}")
        out += ["-C", cwd]
    out.append("--")
    out += [f"{k}={v}" for k, v in env.items()]
    if "=" in argv[0]:
        # env would take it for one more assignment: let sh exec it as "$1"
        out += ["sh", "-c", EXEC_SCRIPT, "sh"]
    out += argv
    return out


#: How long ``timeout`` waits after TERM before it sends KILL.
KILL_AFTER_S = 5


def with_timeout(argv: Sequence[str], timeout: float | None) -> list[str]:
    """``timeout -k 5 Ns ARGV`` (coreutils) so the far side itself stops a command that
    runs too long, with everything it started (timeout signals its process group). An
    SSH client cannot: sshd refuses "signal" requests for root sessions, and closing
    the channel leaves the command running. Exit 124 (or 137 after KILL) means timed out."""
    argv = check_argv(argv)
    if timeout is None:
        return list(argv)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return ["timeout", "-k", str(KILL_AFTER_S), f"{timeout:.3f}s", *argv]


def ssh_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                cwd: str | None = None) -> str:
    """The one string sent over an SSH exec channel (the login shell parses it once)."""
    return shell_join(with_env_cwd(argv, env, cwd))


def pct_exec(vmid: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> list[str]:
    """``pct exec VMID --keep-env 0 -- env [-C DIR] -- K=V... ARGV`` (run on the node).

    ``--keep-env 0`` so the node's environment never leaks in; ``CONTAINER_ENV`` plus
    ``env`` is set explicitly instead (``env`` wins)."""
    full_env = dict(CONTAINER_ENV)
    full_env.update(check_env(env))
    return ["pct", "exec", str(int(vmid)), "--keep-env", "0", "--",
            *with_env_cwd(argv, full_env, cwd)]


def pct_status(vmid: int) -> list[str]:
    return ["pct", "status", str(int(vmid))]


def put_argv(path: str, size: int, mode: int | None = None) -> list[str]:
    """The argv that writes stdin to ``path`` atomically (see PUT_SCRIPT)."""
    if not path or "\0" in path:
        raise ValueError(f"bad remote path {path!r}")
    return ["sh", "-c", PUT_SCRIPT, "sh", path, "" if mode is None else format(mode & 0o7777, "o"),
            str(int(size))]


def get_argv(path: str) -> list[str]:
    if not path or "\0" in path:
        raise ValueError(f"bad remote path {path!r}")
    return ["cat", "--", path]
