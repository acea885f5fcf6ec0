"""Planning ``dfo launch [--run-file F] [--step-pattern RX] -- CMD ARGS...`` (pure): your
own trainer under the same supervisor (run dir, events, logs, status, stop, budgets).

The command stays an argv list from the CLI to ``subprocess.Popen`` in the supervisor
(spec.json's ``trainer`` carries it as a JSON list): nothing in it reaches a shell.
``own_config`` checks what was given before the host is asked anything; the launch facts
then answer ``--resume`` (the glob's matches, or whether a path exists).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Mapping, Sequence

from dfo_contract.own_ladder import LadderStep
from dfo_contract.runspec import Own, ResumeRule

from ..common.errors import ConfigError, NotFoundError
from ..common import own_trainer


@dataclass(frozen=True, kw_only=True)
class OwnConfig:
    """Your own trainer as launch was given it (run file and flags, checked)."""
    command: tuple[str, ...]
    cwd: str | None = None
    step_pattern: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    resume: ResumeRule | None = None
    fallbacks: Mapping[str, tuple[LadderStep, ...]] = field(default_factory=dict)
    thresholds: Mapping[str, Any] = field(default_factory=dict)   # the run file's, then flags
    data: bytes = b"{}\n"          # the run file, shipped as the run's run-file.yaml
    name: str = "own"              # the default run name (from the script's name)

    def trainer(self) -> Own:
        return Own(command=self.command, cwd=self.cwd, step_pattern=self.step_pattern,
                   env=dict(self.env), resume=self.resume, fallbacks=dict(self.fallbacks))


def own_config(o, rf: Mapping[str, Any], data: bytes | None) -> OwnConfig:
    """The run file ``rf`` (parsed) and the options ``o`` checked into one OwnConfig."""
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
    own_trainer.compile_step_pattern(pattern)
    stem = PurePath(command[1] if len(command) > 1 and not command[1].startswith("-")
                    else command[0]).stem
    name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in stem)[:48].lstrip("-._")
    resume = rf.get("resume")
    if o.resume_glob:
        args = o.resume_args or ["--resume", "{path}"]
        if isinstance(args, str):
            try:
                args = shlex.split(args)
            except ValueError as e:
                raise ConfigError(f"--resume-args {args!r}: {e}") from None
        resume = own_trainer.check_resume({"glob": o.resume_glob, "order": o.resume_order,
                                   "args": list(args)}, "--resume-glob")
    ladders = dict(rf.get("fallbacks") or {})
    ladders.update(own_trainer.ladders_from_flags(o.ladder))   # a flag's class replaces the file's
    if o.resume is not None and not resume:
        raise ConfigError("--resume with -- CMD needs `resume:` in the run file",
                          hint="resume: {glob: 'ckpt/step_*', args: [--resume, '{path}']}")
    return OwnConfig(command=tuple(command), cwd=rf.get("cwd"), step_pattern=pattern,
                     env=dict(rf.get("env") or {}),
                     resume=None if not resume else ResumeRule(
                         glob=resume["glob"], order=resume.get("order", "step"),
                         args=tuple(resume.get("args", ("--resume", "{path}")))),
                     fallbacks={c: tuple(s) for c, s in ladders.items()},
                     thresholds={**(rf.get("thresholds") or {}), **dict(o.thresholds)},
                     data=data if data is not None else b"{}\n", name=name or "own")


def resume_glob(cfg: OwnConfig, cwd: str) -> str | None:
    """The glob ``--resume latest`` looks for on the host (absolute)."""
    if cfg.resume is None:
        return None
    g = cfg.resume.glob
    return g if g.startswith("/") else posixpath.join(cwd, g)


def resolve_resume(value: str, cfg: OwnConfig, cwd: str, found: Sequence[tuple[str, float]],
                   missing: Sequence[str]) -> str:
    """``--resume latest``: the newest of the glob's matches ``found`` on the host;
    ``--resume PATH``: PATH, unless the host says it is ``missing``."""
    if value == "latest":
        assert cfg.resume is not None      # own_config refuses --resume without a rule
        best = own_trainer.newest_checkpoint(list(found), cfg.resume.order)
        if not best:
            raise NotFoundError(f"--resume latest: nothing matches {resume_glob(cfg, cwd)}",
                                hint="launch without --resume to start from scratch")
        return best
    if value in missing:
        raise NotFoundError(f"--resume {value}: no such checkpoint", hint="check the path")
    return value


def shown_ladders(cfg: OwnConfig) -> dict[str, list[str]]:
    return {c: [own_trainer.describe_step(x) for x in steps] for c, steps in cfg.fallbacks.items()}
