#!/usr/bin/env python3
"""Run deploy's env probe in a Python environment and compare it with a profile.

    python tools/probe_env.py                                  # this interpreter, profile cpu
    python tools/probe_env.py --python /opt/venv/bin/python --profile gpu-cu128

Prints the fingerprint deploy would record (docs/contracts.md) and, one per line, every
field that does not meet the profile's ``expect:`` (``torch.version.cuda: expected 12.8,
got 13.0``). Exit 0 when all match, 1 otherwise. On a GPU machine this shows the
device fields (count, names, capability) the way deploy's verification sees them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.plan.fingerprint import build_fingerprint, compare, parse_probe, probe_argv  # noqa: E402
from orchestrator.config.profiles import load_profile  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--profile", default="cpu")
    args = ap.parse_args(argv)
    prof = load_profile(args.profile)
    r = subprocess.run(probe_argv(args.python), capture_output=True, text=True, timeout=600)
    probe = parse_probe(r.stdout + "\n" + r.stderr)
    fp = build_fingerprint(probe, profile=prof.name, lock_hash="(not deployed)")
    print(json.dumps(fp, indent=1))
    mism = compare(probe, prof.expect)
    for m in mism:
        print(f"mismatch: {m}")
    print(f"{len(mism)} mismatch(es) against profile {prof.name}")
    return 1 if mism else 0


if __name__ == "__main__":
    sys.exit(main())
