"""Supervise your own trainer (``dfo launch -- CMD ARGS...``): pure planning. No I/O.

An own command gets the same supervisor as the bundled trainer; what dfo cannot know
about it the user says (a run file, see ``orchestrator.config.own_runfile``, or flags):

- ``step_pattern``: a regex with a named group ``step`` (and optionally ``tok_s``): a
  matching output line is a training step (progress, tokens/s);
- ``resume``: a checkpoint ``glob`` (relative to the command's directory), how to ``order``
  the matches (``step``: the last number in the name; ``mtime``; ``name``) and the argument
  template that passes one (``["--resume", "{path}"]``);
- ``fallbacks``: per failure class, a ladder of steps, each one of
  ``{"env": {NAME: VALUE}}`` (set variables), ``{"set_arg": {FLAG: VALUE}}`` (replace or
  append ``FLAG VALUE``), ``{"drop_arg": FLAG}`` (remove ``FLAG`` and its value) or
  ``{"run_first": [CMD, ARGS...]}`` (a command run before each later attempt).

A step is a ``dfo_contract.own_ladder.LadderStep``; the changes in force are that module's
``Changes`` (state.json's ``overrides`` for such a run).
Argument lists stay lists: nothing here builds a shell string.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dfo_contract.own_ladder import STEP_KINDS, Changes, LadderStep
from dfo_contract.trainer_markers import StepMarker

from .errors import ConfigError
from .fallback import FAILURE_CLASSES, TRANSIENT

ORDERS = ("step", "mtime", "name")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$")


def compile_step_pattern(rx: str | None, *, source: str = "--step-pattern") -> re.Pattern | None:
    if rx is None or rx == "":
        return None
    try:
        pat = re.compile(rx)
    except re.error as e:
        raise ConfigError(f"{source}: not a regular expression: {e}",
                          hint=r"e.g. 'step (?P<step>\d+).*tok/s (?P<tok_s>[\d.]+)'") from None
    if "step" not in pat.groupindex:
        raise ConfigError(f"{source}: needs a named group 'step'",
                          hint=r"e.g. 'step (?P<step>\d+)'")
    return pat


def match_step(pat: re.Pattern | None, line: str) -> StepMarker | None:
    """The step a line of your own trainer's output reports (``step``, and ``tokens_per_s``
    when the pattern has a ``tok_s`` group), or None."""
    if pat is None:
        return None
    m = pat.search(line)
    if not m:
        return None
    try:
        step = int(m.group("step"))
    except (TypeError, ValueError):
        return None
    tps = None
    if "tok_s" in pat.groupindex and m.group("tok_s"):
        try:
            tps = float(m.group("tok_s"))
        except ValueError:
            pass
    return StepMarker(step=step, tokens_per_s=tps, phase=None)


# --- ladder steps -----------------------------------------------------------------------------

def check_step(raw: Any, where: str) -> LadderStep:
    """Validate one ladder step (a one-key mapping); ConfigError names ``where``."""
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ConfigError(f"{where}: a fallback step is a mapping with one key",
                          hint="one of " + ", ".join(STEP_KINDS))
    (kind, val), = raw.items()
    if kind not in STEP_KINDS:
        raise ConfigError(f"{where}: unknown fallback step {kind!r}",
                          hint="one of " + ", ".join(STEP_KINDS))
    if kind == "env":
        if not isinstance(val, Mapping) or not val:
            raise ConfigError(f"{where}: env: expected a mapping NAME: VALUE")
        for k, v in val.items():
            if not isinstance(k, str) or not ENV_NAME.match(k):
                raise ConfigError(f"{where}: env: {k!r} is not a variable name")
            if not isinstance(v, (str, int, float, bool)) or isinstance(v, bool):
                raise ConfigError(f"{where}: env.{k}: expected a string or number")
        return LadderStep(env={k: str(v) for k, v in val.items()})
    if kind == "set_arg":
        if not isinstance(val, Mapping) or not val:
            raise ConfigError(f"{where}: set_arg: expected a mapping FLAG: VALUE")
        for k, v in val.items():
            if not isinstance(k, str) or not FLAG.match(k):
                raise ConfigError(f"{where}: set_arg: {k!r} is not a flag like --name")
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise ConfigError(f"{where}: set_arg.{k}: expected a string or number")
        return LadderStep(set_arg={k: str(v) for k, v in val.items()})
    if kind == "drop_arg":
        if not isinstance(val, str) or not FLAG.match(val):
            raise ConfigError(f"{where}: drop_arg: {val!r} is not a flag like --name")
        return LadderStep(drop_arg=val)
    if not isinstance(val, list) or not val or not all(isinstance(x, str) and x for x in val):
        raise ConfigError(f"{where}: run_first: expected a command as a list of strings",
                          hint="e.g. run_first: [python, warm.py, --threads, '1']")
    return LadderStep(run_first=list(val))


def check_ladders(raw: Any, where: str = "fallbacks") -> dict[str, list[LadderStep]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of failure class -> list of steps")
    out = {}
    for cls, steps in raw.items():
        if cls not in FAILURE_CLASSES:
            raise ConfigError(f"{where}: unknown failure class {cls!r}",
                              hint="choose from " + ", ".join(FAILURE_CLASSES))
        if not isinstance(steps, list):
            raise ConfigError(f"{where}.{cls}: expected a list of steps")
        out[cls] = [check_step(s, f"{where}.{cls}[{i}]") for i, s in enumerate(steps)]
    return out


def apply_step(ch: Changes, step: LadderStep) -> tuple[Changes, dict] | None:
    """The changes after ``step`` and what it changed; None when it changes nothing."""
    new = ch.copy()
    if step.env is not None:
        diff = {k: v for k, v in step.env.items() if new.env.get(k) != v}
        new.env.update(diff)
        changed = {f"env.{k}": v for k, v in diff.items()}
    elif step.set_arg is not None:
        diff = {k: v for k, v in step.set_arg.items() if new.set_args.get(k) != v}
        new.set_args.update(diff)
        for k in diff:
            if k in new.drop:
                new.drop.remove(k)
        changed = {f"arg {k}": v for k, v in diff.items()}
    elif step.drop_arg is not None:
        if step.drop_arg in new.drop:
            return None
        new.drop.append(step.drop_arg)
        new.set_args.pop(step.drop_arg, None)
        changed = {f"arg {step.drop_arg}": "dropped"}
    else:
        cmd = list(step.run_first or ())
        if cmd in new.first:
            return None
        new.first.append(cmd)
        changed = {"run_first": " ".join(cmd)}
    return (new, changed) if changed else None


def describe_step(step: LadderStep) -> str:
    if step.env is not None:
        return "env " + " ".join(f"{k}={v}" for k, v in step.env.items())
    if step.set_arg is not None:
        return "set " + " ".join(f"{k} {v}" for k, v in step.set_arg.items())
    if step.drop_arg is not None:
        return f"drop {step.drop_arg}"
    return "run first: " + " ".join(step.run_first or ())


@dataclass(frozen=True)
class OwnChoice:
    cls: str
    step: str | None         # described, or None (same command again)
    changes: Changes
    position: int
    changed: dict
    exhausted: bool = False


def next_step(cls: str, ladder: Sequence[LadderStep], position: int,
              changes: Changes) -> OwnChoice:
    """The first step at or after ``position`` that changes something; a spent ladder
    restarts unchanged for transient classes, else gives up."""
    pos = position
    while pos < len(ladder):
        got = apply_step(changes, ladder[pos])
        if got is not None:
            return OwnChoice(cls, describe_step(ladder[pos]), got[0], pos + 1, got[1])
        pos += 1
    return OwnChoice(cls, None, changes, pos, {}, exhausted=cls not in TRANSIENT)


# --- the attempt's argv -----------------------------------------------------------------------

def _without(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and not nxt.startswith("-")
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def attempt_argv(command: Sequence[str], changes: Changes, *, resume_path: str | None = None,
                 resume_args: Sequence[str] = ()) -> list[str]:
    """The command with the ladder's argument changes and the resume arguments."""
    argv = [command[0]]
    rest = list(command[1:])
    for flag in changes.drop:
        rest = _without(rest, flag)
    for flag, val in changes.set_args.items():
        rest = _without(rest, flag) + [flag, val]
    if resume_path:
        rest += [a.replace("{path}", resume_path) for a in resume_args]
    return argv + rest


_LAST_NUM = re.compile(r"(\d+)(?!.*\d)")


def newest_checkpoint(found: Sequence[tuple[str, float]], order: str) -> str | None:
    """The newest of ``(path, mtime)`` matches: by the last number in the name (``step``),
    by mtime, or by name."""
    if not found:
        return None
    if order == "mtime":
        return max(found, key=lambda x: (x[1], x[0]))[0]
    if order == "name":
        return max(found, key=lambda x: x[0])[0]
    numbered = [(int(m.group(1)), p) for p, _ in found
                if (m := _LAST_NUM.search(p.rsplit("/", 1)[-1]))]
    return max(numbered)[1] if numbered else None


def check_resume(raw: Any, where: str = "resume") -> dict | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with glob, order, args")
    unknown = set(raw) - {"glob", "order", "args"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}",
                          hint="known: glob, order, args")
    glob = raw.get("glob")
    if not isinstance(glob, str) or not glob or "\0" in glob:
        raise ConfigError(f"{where}.glob: expected a glob like ckpt/step_*")
    order = raw.get("order", "step")
    if order not in ORDERS:
        raise ConfigError(f"{where}.order: {order!r}", hint="one of " + ", ".join(ORDERS))
    args = raw.get("args", ["--resume", "{path}"])
    if isinstance(args, str):
        args = args.split()
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args) \
            or not any("{path}" in a for a in args):
        raise ConfigError(f"{where}.args: expected a list of arguments with {{path}} in one",
                          hint="e.g. args: [--resume, '{path}']")
    return {"glob": glob, "order": order, "args": list(args)}


def parse_ladder_flag(text: str) -> tuple[str, LadderStep]:
    """``--ladder CLASS=KIND:VALUE`` -> (class, step): ``env:NAME=VALUE``,
    ``set_arg:FLAG=VALUE``, ``drop_arg:FLAG``, ``run_first:CMD ARGS`` (split like a shell
    would split words, without running one)."""
    where = f"--ladder {text!r}"
    cls, sep, rest = text.partition("=")
    kind, sep2, val = rest.partition(":")
    if not sep or not sep2:
        raise ConfigError(f"{where}: expected CLASS=KIND:VALUE",
                          hint="e.g. --ladder fx_trace_race=drop_arg:--threads")
    check_ladders({cls.strip(): []}, "--ladder")
    kind = kind.strip()
    if kind in ("env", "set_arg"):
        k, eq, v = val.partition("=")
        if not eq:
            raise ConfigError(f"{where}: {kind} needs NAME=VALUE")
        raw: dict = {kind: {k: v}}
    elif kind == "run_first":
        try:
            raw = {kind: shlex.split(val)}
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    else:
        raw = {kind: val}
    return cls.strip(), check_step(raw, where)


def ladders_from_flags(items: Sequence[str]) -> dict[str, list[LadderStep]]:
    """Repeated ``--ladder`` flags, in order, grouped by class."""
    out: dict[str, list[LadderStep]] = {}
    for it in items:
        cls, step = parse_ladder_flag(it)
        out.setdefault(cls, []).append(step)
    return out
