"""Planning ``dfo launch [--run-file F] [--step-pattern RX] -- CMD ARGS...``: a foreign
trainer under the same supervisor (run dir, events, logs, status, stop, budgets).

The command stays an argv list from the CLI to ``subprocess.Popen`` in the supervisor
(spec.json carries it as a JSON list): nothing in it reaches a shell.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.byo_runfile import parse_run_file
from ..errors import ConfigError, NotFoundError
from ..ops import byo
from ..ops import launch_plan as lp
from ..ops.budget import BudgetPolicy
from .preflight import refuse_held_run_lock

if TYPE_CHECKING:
    from .runs import LaunchOptions, RunOps

#: lists a glob's matches with their mtimes on the host (constant; values as arguments)
GLOB_SCRIPT = ("import glob, json, os, sys\n"
               "out = []\n"
               "for p in glob.glob(sys.argv[1]):\n"
               "    try:\n"
               "        out.append([p, os.stat(p).st_mtime])\n"
               "    except OSError:\n"
               "        pass\n"
               "print(json.dumps(out))\n")


def read_run_file(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--run-file {path}: cannot read it ({e.strerror})",
                          hint="give the path of a YAML run file") from None
    return parse_run_file(text, path)


def plan_byo(ops: "RunOps", o: "LaunchOptions") -> lp.LaunchPlan:
    rf = read_run_file(o.run_file) if o.run_file else {}
    command = list(o.command) or list(rf.get("command") or [])
    if not command:
        raise ConfigError("dfo launch --run-file: no command",
                          hint="give it after `--` or as `command:` in the run file")
    if command[0].endswith((".yaml", ".yml")):
        raise ConfigError(f"dfo launch: {command[0]!r} is not a command",
                          hint="a run config goes with --config FILE; your own trainer after "
                               "`--`: dfo launch -- python train.py ...")
    if o.config or o.sets or o.fault:
        raise ConfigError("--config/--set/--fault are for the bundled trainer, not for -- CMD",
                          hint="pass your trainer's own arguments after `--`")
    pattern = o.step_pattern if o.step_pattern is not None else rf.get("step_pattern")
    byo.compile_step_pattern(pattern)
    default_name = Path(command[1] if len(command) > 1 and not command[1].startswith("-")
                        else command[0]).stem
    run_name = lp.check_run_name(o.run_name or "".join(
        c if c.isalnum() or c in "_.-" else "-" for c in default_name)[:48].lstrip("-._")
        or "byo")
    resume_cfg = rf.get("resume")
    if o.resume_glob:
        args = o.resume_args or ["--resume", "{path}"]
        if isinstance(args, str):
            try:
                args = shlex.split(args)
            except ValueError as e:
                raise ConfigError(f"--resume-args {args!r}: {e}") from None
        resume_cfg = byo.check_resume({"glob": o.resume_glob, "order": o.resume_order,
                                       "args": list(args)}, "--resume-glob")
    ladders = dict(rf.get("fallbacks") or {})
    ladders.update(byo.ladders_from_flags(o.ladder))   # a flag's class replaces the file's
    thr = lp.thresholds({**(rf.get("thresholds") or {}), **dict(o.thresholds)})
    pol = dict(o.budget)
    pol["scale"] = o.backoff_scale
    policy = BudgetPolicy.from_json(pol)

    root = ops.layout.root
    probe = ops.probe()
    ops._require_env(probe)
    warnings: list[str] = []
    if not o.env_check:
        warnings.append("env check skipped (--no-env-check)")
    refuse_held_run_lock(ops.host.name, probe, replace=o.replace)
    now = ops.clock()
    run_id = lp.make_run_id(run_name, now)
    run_dir = ops.layout.run_dir(run_id)
    cwd = rf.get("cwd") or run_dir
    resume_path = None
    if o.resume is not None:
        resume_path = _resolve_resume(ops, o.resume, resume_cfg, cwd)
    spec = lp.build_spec(
        run_id=run_id, run_name=run_name, root=root, python=ops.python,
        config_path=posixpath.join(run_dir, "run-file.yaml"), base_config={}, overrides={},
        resume_path=resume_path, checkpoint_dir=run_dir, env={}, fault=None, ladders={},
        budget=policy.to_json(), thresholds_=thr, lock=ops.layout.run_lock,
        restore_cache_argv=None, host=ops.host.name)
    spec["byo"] = {"command": command, "cwd": rf.get("cwd"), "step_pattern": pattern,
                   "env": rf.get("env") or {}, "resume": resume_cfg,
                   "fallbacks": ladders}
    systemd = probe.get("systemd") == "1"
    first = byo.attempt_argv(command, byo.Changes(), resume_path=resume_path,
                             resume_args=(resume_cfg or {}).get("args", ()))
    plan = lp.LaunchPlan(host=ops.host.name, run_id=run_id, run_name=run_name, run_dir=run_dir,
                         mode="systemd" if systemd else "setsid",
                         start_argv=lp.start_argv(ops.python, run_dir, run_id, systemd=systemd,
                                                  stop_timeout_s=thr["stop_timeout_s"]),
                         first_attempt_argv=first,
                         env=lp.attempt_env(spec["byo"]["env"], attempt=1, run_dir=run_dir,
                                            fault=None, run_id=run_id),
                         spec=spec, ladders={c: [byo.describe_step(x) for x in steps]
                                             for c, steps in spec["byo"]["fallbacks"].items()},
                         resume_path=resume_path, warnings=warnings)
    plan.config_bytes = Path(o.run_file).read_bytes() if o.run_file else b"{}\n"
    plan.lock_owner = probe.get("lock_owner") if probe.get("lock") == "held" else None
    return plan


def _resolve_resume(ops: "RunOps", value: str, resume_cfg: dict | None, cwd: str) -> str:
    """``--resume latest``: the newest match of the run file's glob, checked on the host
    before anything starts; ``--resume PATH``: an existing path."""
    if not resume_cfg:
        raise ConfigError("--resume with -- CMD needs `resume:` in the run file",
                          hint="resume: {glob: 'ckpt/step_*', args: [--resume, '{path}']}")
    if value == "latest":
        pattern = resume_cfg["glob"]
        if not pattern.startswith("/"):
            pattern = posixpath.join(cwd, pattern)
        r = ops.t.run([ops.python, "-c", GLOB_SCRIPT, pattern], timeout=60)
        r.check("listing checkpoints")
        try:
            found = [(str(p), float(m)) for p, m in json.loads(r.out or "[]")]
        except (ValueError, TypeError):
            found = []
        best = byo.newest_checkpoint(found, resume_cfg.get("order", "step"))
        if not best:
            raise NotFoundError(f"--resume latest: nothing matches {pattern}",
                                hint="launch without --resume to start from scratch")
        return best
    if not value.startswith("/"):
        raise ConfigError(f"--resume {value!r}: with -- CMD use 'latest' or an absolute path")
    if not ops.t.run(["test", "-e", value], timeout=60).ok:
        raise NotFoundError(f"--resume {value}: no such checkpoint", hint="check the path")
    return value
