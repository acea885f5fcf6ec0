"""What ``dfo launch`` does on the host once a run is planned, as the steps of ONE remote
command (``orchestrator.remote.run_steps``, pure here): move earlier checkpoints aside
(``--new-lineage``), create the run dir (exclusively: no two launches share one), write the
run config and spec.json, record the env's verification, and start the supervisor. Nothing
slow runs before the supervisor owns the run: it seeds the run's compile cache itself (a copy
of the host's live cache, ``spec.cache.restore_argv``), so a launch cut off before that
leaves no copy behind, and a run dir with spec.json is listed by ``dfo status``. Each step is an argv or a file to write; the first that fails
stops the rest, and :data:`WHAT` names it in the error.
"""

from __future__ import annotations

import base64
import json
import posixpath

from dfo_contract import runstate as rs
from dfo_contract.errors import ContractError
from dfo_contract.markers import last_json_line
from dfo_contract.replies import RunStep, StepsReply, StepsRequest, WriteStep
from dfo_contract.runspec import RunSpec

from .run_identity import run_dir_argvs

STEPS_MODULE = "orchestrator.remote.run_steps"
STEPS_MARK = "@dfo-steps "

#: what each step does, for an error that names it
WHAT = {"move_aside": "moving the earlier checkpoints aside",
        "moved": "moving the earlier checkpoints aside",
        "parents": "creating the run dir", "run_dir": "creating the run dir",
        "inside": "creating the run dir", "config": "writing the run config",
        "spec": "writing spec.json",
        "record": "recording the env's verification", "start": "starting the supervisor"}


def spec_bytes(spec: RunSpec) -> bytes:
    return (json.dumps(spec.to_json(), indent=1, sort_keys=True) + "\n").encode()


def _write(step_id: str, path: str, data: bytes, *, optional: bool = False) -> WriteStep:
    return WriteStep(id=step_id, write=path, data=base64.b64encode(data).decode("ascii"),
                     optional=optional)


def launch_steps(plan, locks: str, *, start: bool = True) -> list[RunStep | WriteStep]:
    """The steps of ``plan`` (an ``plan.launch_plan.LaunchPlan``); ``locks``: the host's
    locks dir; ``start``: end with the supervisor's start."""
    ck = plan.spec.resume.checkpoint_dir
    steps: list[RunStep | WriteStep] = []
    if plan.move_aside:
        steps += [RunStep(id="move_aside", run=["mv", "-T", "-n", "--", ck, plan.move_aside]),
                  RunStep(id="moved", run=["test", "!", "-e", ck])]
    parents, mine, *inside = run_dir_argvs(plan.run_dir, locks, ck)
    steps += [RunStep(id="parents", run=parents), RunStep(id="run_dir", run=mine)]
    steps += [RunStep(id="inside", run=a) for a in inside]
    steps.append(_write("config", plan.spec.config.path, plan.config_bytes))
    steps.append(_write("spec", posixpath.join(plan.run_dir, rs.SPEC_FILE), spec_bytes(plan.spec)))
    if plan.record is not None:
        steps.append(_write("record", plan.record[0], plan.record[1], optional=True))
    if start:
        steps.append(RunStep(id="start", run=list(plan.start_argv), timeout=60))
    return steps


def steps_argv(python: str) -> list[str]:
    return [python, "-m", STEPS_MODULE]


def steps_stdin(steps: list[RunStep | WriteStep]) -> bytes:
    return json.dumps(StepsRequest(steps=list(steps)).to_json()).encode()


def steps_timeout(steps: list[RunStep | WriteStep]) -> float:
    return 60.0 + sum(s.timeout for s in steps if isinstance(s, RunStep))


def parse_reply(output: str) -> StepsReply | None:
    """The run_steps answer (``StepsReply``: done, or the failed step); None: no answer, or
    one that is not such a reply."""
    lines = [ln[len(STEPS_MARK):] for ln in output.splitlines() if ln.startswith(STEPS_MARK)]
    reply = last_json_line("\n".join(lines)) if lines else None
    try:
        return StepsReply.from_json(reply) if isinstance(reply, dict) else None
    except ContractError:
        return None
