"""A launch's writes and its start, in one round trip:
``python -m orchestrator.remote.run_steps < STEPS.json``.

The steps come on stdin as ``{"steps": [...]}`` (``dfo_contract.replies.StepsRequest``) and
run in order; each is either a ``RunStep`` ``{"id": ID, "run": [argv...], "timeout": S}``
(an argv, never a shell line; its output is kept) or a ``WriteStep`` ``{"id": ID, "write":
PATH, "data": BASE64, "mode": 420, "optional": false}`` (written atomically: a temporary
name beside it, fsync, rename). The first step that fails stops the rest; an ``optional``
write that fails is passed over. One line answers (``StepsReply``): ``@dfo-steps {"done":
N, ...}`` or ``@dfo-steps {"failed": ID, "exit_code": C, "stdout": ..., "stderr": ...}``;
the caller turns a failed step into its own error
(``orchestrator.plan.launch_steps``). Stdlib and ``dfo_contract`` only.

Once the steps have arrived they run to their end: Ctrl-C on the laptop (SIGINT to a local
launch's process group) or a dropped connection (SIGHUP, a closed stdout) does not cut them
off between creating the run dir and starting its supervisor, so a launch either leaves
nothing or a run its supervisor owns. The supervisor gets the default signal handlers.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys

from dfo_contract.fsio import atomic_write_bytes
from dfo_contract.replies import RunStep, StepsReply, StepsRequest, WriteStep

MARK = "@dfo-steps "
#: how much of a failed step's output comes back
TAIL = 4000


#: the signals the steps are shielded from (see the module doc)
SHIELDED = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)


def _default_signals() -> None:
    for sig in SHIELDED:
        signal.signal(sig, signal.SIG_DFL)


def _answer(reply: StepsReply) -> None:
    try:
        print(MARK + json.dumps(reply.to_json()), flush=True)
    except OSError:   # the caller is gone (Ctrl-C, a dropped connection): the steps stand
        pass


def run_step(step: RunStep | WriteStep) -> StepsReply | None:
    """None when the step did what it says, else what went wrong (its ``failed`` unset)."""
    if isinstance(step, WriteStep):
        try:
            atomic_write_bytes(step.write, base64.b64decode(step.data), mode=step.mode)
        except OSError as e:
            if step.optional:
                return None
            return StepsReply(exit_code=1, stderr=f"{step.write}: {e.strerror or e}")
        return None
    try:
        p = subprocess.run(step.run, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=step.timeout, preexec_fn=_default_signals)
    except FileNotFoundError as e:
        return StepsReply(exit_code=127, stderr=f"{e.filename}: not found")
    except subprocess.TimeoutExpired:
        return StepsReply(exit_code=124, stderr=f"timed out after {step.timeout:g}s")
    if p.returncode == 0:
        return None
    return StepsReply(exit_code=p.returncode,
                      stdout=p.stdout.decode("utf-8", "replace")[-TAIL:],
                      stderr=p.stderr.decode("utf-8", "replace")[-TAIL:])


def run_all(steps: list[RunStep | WriteStep]) -> StepsReply:
    """Run ``steps`` in order; the answer (``done``, or the first failure)."""
    for step in steps:
        bad = run_step(step)
        if bad is not None:
            return dataclasses.replace(bad, failed=step.id)
    return StepsReply(done=len(steps))


def _shielded(steps: list[RunStep | WriteStep]) -> StepsReply:
    """``run_all`` in a child of its own session, so that nothing aimed at the caller's
    session (Ctrl-C, a killed ``pct exec``/SSH session, a local transport's kill of the
    command's process group) cuts the steps off; the answer comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child's coverage is not collected
        os.close(r)
        os.setsid()
        reply = run_all(steps)
        try:
            os.write(w, json.dumps(reply.to_json()).encode())
        except OSError:
            pass
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    try:
        return StepsReply.from_json(json.loads(b"".join(chunks)))
    except ValueError:   # ContractError is one
        return StepsReply(exit_code=1, stderr="the launch steps ended without an answer")


def main() -> int:
    for sig in SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    try:
        steps = StepsRequest.from_json(json.loads(sys.stdin.buffer.read() or b"{}")).steps
    except ValueError as e:   # not JSON, or not the steps (ContractError)
        _answer(StepsReply(exit_code=2, stderr=f"steps unreadable: {e}"))
        return 2
    reply = _shielded(steps)
    _answer(reply)
    return 0 if reply.done is not None else 1


if __name__ == "__main__":
    sys.exit(main())
