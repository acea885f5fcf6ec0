"""Start a module the way ``python -m MODULE ARGS`` would, with two guarantees added:

- ``faulthandler.register(SIGUSR1, all_threads=True)``: the watchdog can dump every
  thread's Python stack of a hung attempt (into its log) without py-spy and without the
  trainer's cooperation (SIGUSR1 to a process without a handler would kill it);
- ``PR_SET_PDEATHSIG=SIGKILL``: the process dies with its parent (the supervisor, or
  torchrun for ddp workers, which torchrun starts in sessions of their own).

``python -m orchestrator.supervisor.shim trainer train --config ...``

``--standby --ready-fd N --preload JSON`` (the standby interpreter, docs/recovery.md): lower
its priority where it can be restored, import what ``trainer.preload`` lists, write one
``Ready`` line to fd N, then block on stdin for one ``Request`` line (EOF: exit 0). With it:
restore the priority, point fds 1 and 2 at the attempt log (append), stdin at /dev/null,
chdir, replace ``os.environ``, set ``sys.argv`` and run the module as above.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import time


def _guards() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    try:
        from .procs import set_pdeathsig

        set_pdeathsig(signal.SIGKILL)
    except OSError:
        pass


def _run(module: str, argv: list[str]) -> None:
    sys.argv = argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--standby":
        return standby(sys.argv[2:])
    if len(sys.argv) < 2:
        print("usage: python -m orchestrator.supervisor.shim MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    _guards()
    module = sys.argv[1]
    _run(module, [module] + sys.argv[2:])


# --- the standby interpreter ------------------------------------------------------------------

def _cap_eff() -> int:
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                if ln.startswith("CapEff:"):
                    return int(ln.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _lower_priority() -> int | None:
    """+NICE when the attempt can get the old priority back (see supervisor.policy.standby); the old
    nice value, or None when left as it is."""
    import resource

    from .policy.standby import NICE, can_restore_priority

    now = os.getpriority(os.PRIO_PROCESS, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NICE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NICE, (hard, hard))
        except (ValueError, OSError):
            pass
    if not can_restore_priority(euid=os.geteuid(), cap_eff=_cap_eff(), nice_now=now,
                                rlimit_nice_hard=-1 if hard == resource.RLIM_INFINITY
                                else int(hard)):
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(19, now + NICE))
    return now


def _restore_priority(old: int) -> None:
    """Every thread of this process (Linux nice values are per thread) and its children
    (compile workers started while importing) back to ``old``."""
    from .procs import descendants

    ids = set()
    try:
        ids |= {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        ids.add(0)
    ids |= set(descendants(os.getpid()))
    for i in ids:
        try:
            os.setpriority(os.PRIO_PROCESS, i, old)
        except OSError:
            pass


def standby(args: list[str]) -> None:
    import argparse
    import json

    from .policy.standby import Preload, Ready, Request

    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor.shim --standby")
    ap.add_argument("--ready-fd", type=int, required=True)
    ap.add_argument("--preload", required=True)
    a = ap.parse_args(args)
    _guards()
    t0 = time.monotonic()
    old = _lower_priority()
    pre = Preload.from_json(json.loads(a.preload))
    try:
        from trainer.preload import preload

        done, failed = preload(target_path=pre.target_path, compile=pre.compile,
                               layout=pre.layout)
        err = "; ".join(failed) or None
    except Exception as e:  # noqa: BLE001 - reported to the supervisor, which starts fresh
        done, err = [], f"{e.__class__.__name__}: {e}"
    with os.fdopen(a.ready_fd, "wb", buffering=0) as f:
        f.write(Ready(time.monotonic() - t0, done, old is not None, err).to_line())
    line = sys.stdin.buffer.readline()
    if not line.strip():
        raise SystemExit(0)           # discarded: the supervisor closed our stdin
    req = Request.from_line(line)
    module, argv = req.module_argv()
    if old is not None:
        _restore_priority(old)
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(req.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(req.cwd)
    os.environ.clear()
    os.environ.update(req.env)
    _run(module, argv)


if __name__ == "__main__":
    main()
