#!/usr/bin/env python3
"""What `dfo launch` does not run on every launch on a GPU host: the env probe
(`orchestrator/remote/env_probe.py`: imports torch, transformers, trainer and compiles the
flex_attention smoke test on cuda:0), timed N times with the machine's python3, against
the shell stamp that replaces it (`orchestrator/plan/scripts/launch_facts.sh`'s walk of
site-packages, run here on python3's own site-packages).

    python3 bench/h200_env_probe.py [--n 3]      # results to $OUT/env_probe.json (or ./)
"""

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3)
    a = ap.parse_args()
    src = (REPO / "orchestrator" / "remote" / "env_probe.py").read_text()
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_MODULE_LOADING="LAZY")
    out = {"probe_s": [], "probe_no_smoke_s": [], "stamp_walk_s": []}
    for _ in range(a.n):
        for key, extra in (("probe_s", {}), ("probe_no_smoke_s", {"DFO_PROBE_SMOKE": "0"})):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", src], env={**env, **extra},
                               capture_output=True, text=True, timeout=900)
            out[key].append(round(time.perf_counter() - t0, 3))
            out.setdefault("probe_answer", r.stdout.strip()[-600:])
        sp = sysconfig.get_paths()["purelib"]
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", 'find "$1" -name __pycache__ -prune -o -printf "%P\\n" '
                        '| LC_ALL=C sort | sha256sum; find "$1" -name __pycache__ -prune -o '
                        '! -type d -newerct "@$(date +%s)" -print -quit', "x", sp],
                       capture_output=True, timeout=300)
        out["stamp_walk_s"].append(round(time.perf_counter() - t0, 3))
    print(json.dumps(out, indent=1))
    dest = Path(os.environ.get("OUT", ".")) / "env_probe.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
