"""Which modules a trainer start's imports spend their time in (``python -X importtime``).

    python3 bench/import_probe.py [--top 30] [--json OUT.json]

One fresh interpreter imports what ``step.build_models`` imports before any weight is read:
torch, transformers, ``AutoModelForCausalLM`` and the Qwen3 modeling module. Prints the
cumulative seconds of torch and of the rest (transformers' side), the top modules by
cumulative time (import depth <= 2) and by self time, and how many distributions the
interpreter sees (transformers probes optional packages: a fuller site-packages costs more).
``bench/build_probe.py`` measures the same imports as wall time beside the rest of the build.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import subprocess
import sys

CODE = ("import torch; import transformers; from transformers import AutoModelForCausalLM; "
        "from transformers.models.qwen3 import modeling_qwen3")


def parse(stderr: str) -> list[tuple[int, int, int, str]]:
    """(self_us, cumulative_us, depth, module) per ``-X importtime`` line."""
    rows = []
    for ln in stderr.splitlines():
        if not ln.startswith("import time:") or ln.count("|") != 2:
            continue
        a, b, name = ln[len("import time:"):].split("|")
        try:
            self_us, cum_us = int(a), int(b)
        except ValueError:   # the header line
            continue
        stripped = name.rstrip()
        depth = (len(stripped) - len(stripped.lstrip())) // 2
        rows.append((self_us, cum_us, depth, stripped.strip()))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", CODE], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        return 1
    rows = parse(r.stderr)
    cum = {}
    for _, c, _, n in rows:
        cum[n] = max(cum.get(n, 0), c)
    report = {
        "torch_s": cum.get("torch", 0) / 1e6,
        "transformers_s": cum.get("transformers", 0) / 1e6,
        "total_s": sum(c for _, c, d, _ in rows if d == 0) / 1e6,
        "top_cumulative": [(n, round(c / 1e6, 3), d) for _, c, d, n in
                           sorted((x for x in rows if x[2] <= 2), key=lambda x: -x[1])[:a.top]],
        "top_self": [(n, round(s / 1e6, 3)) for s, _, _, n in
                     sorted(rows, key=lambda x: -x[0])[:a.top]],
        "distributions": len(list(md.distributions())),
    }
    # transformers' lazy modules import the modeling code as top-level entries of their own:
    # everything after torch is the transformers side
    print(f"total {report['total_s']:.2f} s: torch {report['torch_s']:.2f} s, the rest "
          f"{report['total_s'] - report['torch_s']:.2f} s (package transformers itself "
          f"{report['transformers_s']:.2f} s); {report['distributions']} distributions")
    print("-- cumulative (depth <= 2)")
    for n, c, d in report["top_cumulative"]:
        print(f"{c:8.3f}  {'  ' * d}{n}")
    print("-- self")
    for n, s in report["top_self"]:
        print(f"{s:8.3f}  {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
