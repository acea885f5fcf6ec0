"""A launch's writes and its start, in one round trip:
``python -m orchestrator.remote.run_steps < STEPS.json``.

The steps come on stdin as ``{"steps": [...]}`` and run in order; each is either
``{"id": ID, "run": [argv...], "timeout": S}`` (an argv, never a shell line; its output is
kept) or ``{"id": ID, "write": PATH, "data": BASE64, "mode": 420, "optional": false}``
(written atomically: a temporary name beside it, fsync, rename). The first step that fails
stops the rest; an ``optional`` write that fails is passed over. One line answers:
``@dfo-steps {"done": N}`` or ``@dfo-steps {"failed": ID, "exit_code": C, "stdout": ...,
"stderr": ...}``; the caller turns a failed step into its own error
(``orchestrator.ops.launch_steps``). Stdlib and ``dfo_contract`` only.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from dfo_contract.fsio import atomic_write_bytes

MARK = "@dfo-steps "
#: how much of a failed step's output comes back
TAIL = 4000


def run_step(step: dict) -> dict | None:
    """None when the step did what it says, else what went wrong."""
    if "write" in step:
        try:
            atomic_write_bytes(step["write"], base64.b64decode(step["data"]),
                               mode=int(step.get("mode", 0o644)))
        except OSError as e:
            if step.get("optional"):
                return None
            return {"exit_code": 1, "stdout": "", "stderr": f"{step['write']}: {e.strerror or e}"}
        return None
    try:
        p = subprocess.run([str(a) for a in step["run"]], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=float(step.get("timeout", 60)))
    except FileNotFoundError as e:
        return {"exit_code": 127, "stdout": "", "stderr": f"{e.filename}: not found"}
    except subprocess.TimeoutExpired:
        return {"exit_code": 124, "stdout": "", "stderr": f"timed out after {step.get('timeout')}s"}
    if p.returncode == 0:
        return None
    return {"exit_code": p.returncode, "stdout": p.stdout.decode("utf-8", "replace")[-TAIL:],
            "stderr": p.stderr.decode("utf-8", "replace")[-TAIL:]}


def main() -> int:
    try:
        steps = json.loads(sys.stdin.buffer.read() or b"{}").get("steps") or []
    except (ValueError, AttributeError) as e:
        print(MARK + json.dumps({"failed": None, "exit_code": 2, "stdout": "",
                                 "stderr": f"steps unreadable: {e}"}), flush=True)
        return 2
    for i, step in enumerate(steps):
        bad = run_step(step)
        if bad is not None:
            print(MARK + json.dumps({"failed": step.get("id", i), **bad}), flush=True)
            return 1
    print(MARK + json.dumps({"done": len(steps)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
