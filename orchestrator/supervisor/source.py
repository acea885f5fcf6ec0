"""Where an attempt comes from: the run's trainer (spec ``trainer``), chosen once by
:func:`source_for`.

- :class:`BundledSource`: ``python -m trainer train`` through the shim; it reads the
  attempt's layout, process count and dense-path expectation from spec.json's ``trainer``
  (``Bundled``, computed by launch from the typed config), or, once a fallback changed the
  overrides, from the typed config in force (``config``); it resumes the
  newest verified checkpoint of this run, takes its part of a multi-node run from the role
  (``role.Placement``). Every attempt trains with the config the run was launched with:
  ``config.yaml`` as it was when the first attempt started is kept beside it
  (``config.launched.yaml``), and an attempt that finds ``config.yaml`` edited since says so
  (a ``config_edited`` event naming each changed setting) and keeps the launch config.
- :class:`OwnSource`: an own command (``dfo launch -- CMD ARGS...``); it resumes what the
  run file's glob finds, runs a ladder step's ``run_first`` commands before the attempt and
  falls back over the run file's ladders.

Both choose the next config with ``common.verdict.choose`` (the one ladder choice, shared with
``dfo diagnose``).

A source decides; it keeps no state of its own (the run's state comes in). Beside it: why
an attempt cannot start (:func:`cannot_start`, :func:`cannot_start_reason`), what the run's
history keeps of a ladder's choice (:func:`fallback_record`), why a run finished
(:func:`done_reason`).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from dfo_contract import events
from dfo_contract.checkpoints import newest_of_run
from dfo_contract import trainer_config as tcfg
from dfo_contract.runspec import Bundled, Identity, Own, RunSpec
from dfo_contract.runstate import FallbackRecord, RunState
from dfo_contract.state_records import Overrides, changes_of, config_overrides
from dfo_contract.trainer_config import TrainerConfig

from ..common import own_trainer
from ..common.launch_argv import attempt_env, flatten, trainer_argv
from ..common.verdict import Ladders, Verdict, choose
from . import own_attempt
from .role import Role

Emit = Callable[[events.Event], Any]


@dataclass(frozen=True)
class Launch:
    """One attempt's process: its argv, env and directory, the checkpoint it resumes, and
    the commands to run before it (your own trainer's ``run_first``)."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    resume: str | None
    first: list[list[str]] = field(default_factory=list)


class AttemptSource(Protocol):
    #: an own command (never preloaded by a standby)
    own: bool
    #: the watchdog's step-line pattern (None: the trainer's ``@dfo`` markers)
    step_pattern: str | None
    #: CPU time of the process tree counts as progress (a trainer without heartbeats)
    cpu_is_progress: bool

    def initial(self) -> Overrides: ...
    def config(self, overrides: Overrides) -> TrainerConfig | None: ...
    def bundled(self, overrides: Overrides) -> Bundled | None: ...
    def attempt_env(self, n: int) -> dict[str, str]: ...
    def launch(self, n: int, state: RunState, role: Role) -> Launch: ...
    def run_first(self, n: int, launch: Launch, log_path: str, timeout: float) -> None: ...
    def next_choice(self, cls: str, position: int, overrides: Overrides) -> Verdict: ...


class _Source:
    """What both sources share: the spec, the run dir and the attempt's base env."""
    own = False
    step_pattern: str | None = None
    cpu_is_progress = False
    fault: str | None = None

    def __init__(self, spec: RunSpec, run_dir: str, emit: Emit):
        self.spec = spec
        self.run_dir = run_dir
        self.emit = emit

    def config(self, overrides: Overrides) -> TrainerConfig | None:
        """The bundled trainer's typed config in force (None: an own command)."""
        return None

    def bundled(self, overrides: Overrides) -> Bundled | None:
        """The bundled trainer's part in force (None: an own command)."""
        return None

    def attempt_env(self, n: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(attempt_env(self.spec.cache.env, attempt=n, run_dir=self.run_dir,
                               fault=self.fault, run_id=self.spec.identity.run_id))
        return env

    def next_choice(self, cls: str, position: int, overrides: Overrides) -> Verdict:
        return choose(Ladders.from_spec(self.spec), cls, position, overrides)

    def run_first(self, n: int, launch: Launch, log_path: str, timeout: float) -> None:
        if launch.first:
            ok, why = own_attempt.run_first(launch.first, launch.env, launch.cwd, log_path,
                                        timeout=timeout)
            self.emit(events.RunFirst(attempt=n, commands=launch.first, ok=ok, detail=why))


class BundledSource(_Source):
    def __init__(self, spec: RunSpec, trainer: Bundled, run_dir: str, emit: Emit):
        super().__init__(spec, run_dir, emit)
        self.trainer = trainer
        self.fault = trainer.fault
        #: the edit of config.yaml last told (``config_edited``): told once, not per attempt
        self.edit_told: dict | None = None

    def initial(self) -> Overrides:
        """Attempt 1's overrides: launch's ``--set``."""
        return dict(self.spec.config.overrides)

    def config(self, overrides: Overrides) -> TrainerConfig:
        """The typed config in force: spec.json's base with ``overrides``."""
        return tcfg.from_flat(self.spec.config.merged(config_overrides(overrides)))

    def bundled(self, overrides: Overrides) -> Bundled:
        """spec.json's ``trainer`` with attempt 1's overrides; with others (a fallback's),
        the same part of the config they make."""
        if config_overrides(overrides) == dict(self.spec.config.overrides):
            return self.trainer
        return Bundled.of(self.config(overrides), self.fault)

    def resume_target(self, state: RunState) -> str | None:
        """Once this run has saved a checkpoint: the newest one whose manifest verifies and
        names this run (torn/corrupt ones are skipped and reported; another run's are never
        taken, even when newer). Else: exactly the checkpoint launch was given (--resume),
        else None (from scratch)."""
        spec = self.spec
        if not state.last_checkpoint:
            return spec.resume.path  # this run saved nothing yet: what launch was given
        info, skipped = newest_of_run(spec.resume.checkpoint_dir, spec.identity.run_id)
        for c in skipped:
            self.emit(events.Watchdog(attempt=state.attempt + 1,
                                      reason=f"skipping checkpoint {c.name}: {c.reason}"))
        return (info.path if info else None) or spec.resume.path

    def launched_config(self, n: int) -> str:
        """The config file attempt ``n`` trains with: the run's config as launched."""
        path = self.spec.config.path
        kept = os.path.join(os.path.dirname(path), "config.launched.yaml")
        if not os.path.exists(kept):
            tmp = f"{kept}.tmp-{os.getpid()}"
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, kept)
            except OSError:   # a run directory it cannot write to: the file as it is
                return path
            return kept
        changed = config_changes(kept, path)
        if changed is not None and changed != self.edit_told:
            self.emit(events.ConfigEdited(attempt=n, changed=changed))
        self.edit_told = changed
        return kept

    def launch(self, n: int, state: RunState, role: Role) -> Launch:
        spec = self.spec
        part = self.bundled(state.overrides)
        threads = self.config(state.overrides).compile.threads
        at = role.place(n, lambda: self.resume_target(state))
        env = self.attempt_env(n)
        env.update(at.env)
        if threads:   # the compile_workers ladder's step, as torch reads it
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        argv = trainer_argv(spec.identity.python, self.launched_config(n), config_overrides(state.overrides),
                            run_dir=self.run_dir, checkpoint_dir=spec.resume.checkpoint_dir,
                            resume=at.resume, layout=part.layout,
                            nproc=at.nproc if at.nproc is not None else part.nproc,
                            rdzv=at.rdzv)
        return Launch(argv, env, self.run_dir, at.resume)


class OwnSource(_Source):
    own = True
    cpu_is_progress = True

    def __init__(self, spec: RunSpec, own: Own, run_dir: str, emit: Emit):
        super().__init__(spec, run_dir, emit)
        self.own_spec = own
        self.step_pattern = own.step_pattern

    def initial(self) -> Overrides:
        """Attempt 1 runs the command as given: nothing changed."""
        return own_trainer.Changes()

    def launch(self, n: int, state: RunState, role: Role) -> Launch:
        own = self.own_spec
        changes = changes_of(state.overrides)
        resume = own_attempt.resume_target(own, self.run_dir,
                                       since=float(state.started_at or 0) - 1.0) \
            or self.spec.resume.path
        env = own_attempt.env(own, self.spec.identity.python, changes, self.attempt_env(n))
        return Launch(own_attempt.argv(own, changes, resume), env, own_attempt.cwd(own, self.run_dir),
                      resume, list(changes.first))


def config_changes(kept: str, path: str) -> dict[str, list] | None:
    """None when ``path`` holds the same bytes as ``kept`` (or is gone); else each
    ``SECTION.FIELD`` whose value differs, as [kept's, path's]."""
    import yaml

    try:
        with open(kept, "rb") as f:
            a = f.read()
        with open(path, "rb") as f:
            b = f.read()
    except FileNotFoundError:
        return None
    if a == b:
        return None
    try:
        old, new = flatten(yaml.safe_load(a) or {}), flatten(yaml.safe_load(b) or {})
    except yaml.YAMLError:
        return {"config.yaml": ["(as launched)", "(not valid YAML)"]}
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)}


class CannotStart(Exception):
    """An attempt's program is not there (the deployed env gone, an own command removed):
    the run ends ``failed`` with this reason rather than trying it."""


def cannot_start(argv: list[str], env: Mapping[str, str], identity: Identity,
                 own: bool) -> str | None:
    """Why attempt's ``argv`` cannot start on this host, or None. The deployed env
    (``envs/current``, whose python the bundled trainer runs and an own command finds first
    on PATH) gone is named with its repair: a deploy, then a resume."""
    env_dir = os.path.dirname(os.path.dirname(identity.python))
    program = argv[0] if os.sep in argv[0] else (
        shutil.which(argv[0], path=env.get("PATH")) or argv[0])
    uses_env = not own or program.startswith(env_dir + os.sep) or os.sep not in program
    if uses_env and not os.path.exists(identity.python):
        return (f"the deployed env {env_dir} is missing ({identity.python} not found): run "
                f"`dfo deploy --host {identity.host}`, then dfo launch --resume latest")
    if os.sep in program and not os.access(program, os.X_OK):
        return (f"the command {program} is not there or not executable: fix the run file's "
                "command, then dfo launch --resume latest")
    return None


def cannot_start_reason(argv, cwd: str | None, e: OSError) -> str:
    """Why ``argv`` could not start, in one line: a program whose ``#!`` interpreter is
    missing is named as such (the kernel says only "No such file or directory")."""
    prog = os.path.join(cwd or "", argv[0]) if "/" in argv[0] else argv[0]
    if cwd and not os.path.isdir(cwd):
        return f"cannot start the trainer: its working directory {cwd} does not exist"
    if e.errno == errno.ENOENT and os.path.isfile(prog):
        try:
            with open(prog, "rb") as f:
                first = f.readline(256).decode("utf-8", "replace").strip()
        except OSError:
            first = ""
        if first.startswith("#!"):
            return (f"cannot start the trainer: {argv[0]}'s interpreter {first[2:].strip()} "
                    "does not exist (its #! line)")
    return (f"cannot start the trainer: {argv[0]}: {e.strerror or e}; fix the command or its "
            "directory, then dfo launch --resume latest")


def fallback_record(cls: str, choice: Verdict, n: int) -> FallbackRecord | None:
    """What the run's history keeps of the ladder's choice after attempt N failed with
    ``cls`` (None: a plain restart)."""
    if choice.step and choice.step != "same":
        return FallbackRecord(cls=cls, step=choice.step, changed=choice.changed, attempt=n)
    if choice.note:
        return FallbackRecord(cls=cls, step="restart unchanged", note=choice.note, changed={},
                              attempt=n)
    return None


def done_reason(last_step: int | None, own: bool) -> str:
    """The final reason of a run that finished."""
    if last_step is not None:
        return (f"the command exited 0 at step {last_step}" if own
                else f"reached max_steps at step {last_step}")
    return ("the command exited 0 (it reported no steps)" if own
            else "the trainer exited 0 (it reported no steps)")


def source_for(spec: RunSpec, run_dir: str, emit: Emit) -> AttemptSource:
    """The run's attempt source, from its spec's ``trainer``."""
    tr = spec.trainer
    return OwnSource(spec, tr, run_dir, emit) if isinstance(tr, Own) \
        else BundledSource(spec, tr, run_dir, emit)
