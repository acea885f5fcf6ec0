"""``python -m orchestrator.supervisor --run-dir DIR``: supervise one run (``core.Supervisor``)."""

import argparse
import sys

from dfo_contract.errors import ContractError

from .core import Supervisor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor")
    ap.add_argument("--run-dir", required=True)
    a = ap.parse_args(argv)
    try:
        return Supervisor(a.run_dir).run()
    except (FileNotFoundError, ContractError) as e:
        print(f"dfo-supervisor: {e}", file=sys.stderr)
        return 0  # nothing it can supervise: never restart-loop on it


sys.exit(main())
