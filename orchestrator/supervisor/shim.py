"""Start a module the way ``python -m MODULE ARGS`` would, with two guarantees added:

- ``faulthandler.register(SIGUSR1, all_threads=True)``: the watchdog can dump every
  thread's Python stack of a hung attempt (into its log) without py-spy and without the
  trainer's cooperation (SIGUSR1 to a process without a handler would kill it);
- ``PR_SET_PDEATHSIG=SIGKILL``: the process dies with its parent (the supervisor, or
  torchrun for ddp workers, which torchrun starts in sessions of their own).

``python -m orchestrator.supervisor.shim trainer train --config ...``
"""

from __future__ import annotations

import faulthandler
import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m orchestrator.supervisor.shim MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    try:
        from .procs import set_pdeathsig

        set_pdeathsig(signal.SIGKILL)
    except OSError:
        pass
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
