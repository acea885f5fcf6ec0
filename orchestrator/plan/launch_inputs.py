"""What ``dfo launch`` was asked, checked before the host is asked anything (pure): the
options (:class:`LaunchOptions`), the trainer's input (:class:`BundledConfig`: the run config
as ``config.runconfig.load_run_layers`` parsed it once, with ``--set`` applied once, a typed
``TrainerConfig``; ``launch_own.OwnConfig``: your own trainer's run file and flags) and
:func:`prepare`, which checks them (``--resume``, parsed once into a ``ResumeChoice``; ``--run-name``, ladders, budget,
thresholds, ``--fault``) and names the run -> :class:`LaunchInputs` (``plan.launch_plan``
plans from it, with the host's facts: ``plan.launch_facts``).

Nothing a user types reaches a shell: ``--resume`` is a checkpoint name, ``latest`` or a
path under the host's root made of plain characters.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from dfo_contract.checkpoints import STEP_RE
from dfo_contract.runspec import Budget, ResumeChoice, Thresholds
from dfo_contract.trainer_config import TrainerConfig

from ..config.runconfig import RunLayers
from ..common.errors import ConfigError
from ..common.budget import BudgetPolicy
from ..common.fallback import merge_ladders, validate_ladders
from .launch_own import OwnConfig
from .run_identity import make_run_id
from .thresholds import thresholds as check_thresholds

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/@+=-]*")
SET_KEY = re.compile(r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*")
#: longest ``--resume`` a user may give (a path under the root)
RESUME_MAX = 4096

#: keys launch owns; --set may not change them
RESERVED_KEYS = frozenset({"run.dir", "checkpoint.dir", "fault.spec"})



@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    config: str | None = None
    resume: str | None = None
    run_name: str | None = None
    sets: Sequence[str] = ()
    replace: bool = False
    dry_run: bool = False
    fault: str | None = None
    fault_node: int | None = None  # --group: the one node that gets the fault (None: all)
    backoff_scale: float = 1.0
    thresholds: Mapping[str, float] = field(default_factory=dict)
    budget: Mapping[str, Any] = field(default_factory=dict)
    fallbacks: Mapping[str, Any] | None = None
    env_check: bool = True
    start_timeout: float = 60.0
    new_lineage: bool = False     # move an earlier run's checkpoints aside, start over
    #: your own trainer (``dfo launch -- CMD ARGS...``, plan.launch_own)
    command: Sequence[str] = ()
    run_file: str | None = None
    step_pattern: str | None = None
    resume_glob: str | None = None
    resume_order: str = "step"
    resume_args: Sequence[str] | str = ()   # a str is split into words (no shell)
    ladder: Sequence[str] = ()    # --ladder CLASS=KIND:VALUE, in order
    run_id: str | None = None     # given (engine.group_runs: one id on every node), else made
    #: the standby interpreter (supervisor.standby; --no-standby turns it off), and extra
    #: env given to the standby only (a test facility: a differing import-time key makes
    #: every standby be discarded)
    standby: bool = True
    standby_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def own(self) -> bool:
        """Your own trainer (``-- CMD``, a run file, or its flags)."""
        return bool(self.command or self.run_file or self.resume_glob or self.ladder)


@dataclass(frozen=True, kw_only=True)
class BundledConfig:
    """The bundled trainer's run config as launch loaded it: ``layers`` (one parse of the
    file, ``--set`` applied once); everything after reads ``config``, the typed config."""
    source: str | None          # --config (None: the host's default run config)
    name: str                   # the file's stem: the default run name
    layers: RunLayers

    @property
    def config(self) -> TrainerConfig:
        """The config in force (the file over the defaults, with ``--set``), validated."""
        return self.layers.config


TrainerInput = Union[BundledConfig, OwnConfig]


@dataclass(frozen=True, kw_only=True)
class LaunchInputs:
    """Everything launch checked before it touched the host."""
    run_name: str
    run_id: str
    run_dir: str
    now: float                    # when launch was asked (the run id's time)
    resume: ResumeChoice          # --resume, parsed once (absent: scratch)
    thresholds: Thresholds
    budget: Budget
    ladders: Mapping[str, list[str]]
    trainer: TrainerInput


def prepare(o: LaunchOptions, trainer: TrainerInput, host, now: float) -> LaunchInputs:
    """Check ``o`` and ``trainer`` for ``host`` (a HostConfig); name the run."""
    tree = host.tree
    resume = parse_resume(o.resume, tree.root, own=isinstance(trainer, OwnConfig))
    if not resume.is_scratch and o.new_lineage:
        raise ConfigError("--new-lineage starts over; it cannot be combined with --resume",
                          hint="drop one of the two")
    if o.run_name is None:   # your own trainer's name is made valid from its command
        run_name = check_run_name(trainer.name, derived_from=(
            f"the config file's name ({o.config})" if o.config else "the default config"))
    else:
        run_name = check_run_name(o.run_name)
    if isinstance(trainer, OwnConfig):
        thr, ladders = check_thresholds(trainer.thresholds), {}
    else:
        thr = check_thresholds(o.thresholds)
        ladders = merge_ladders(
            validate_ladders(dict(host.fallbacks) or None,
                             source=f"{host.source or 'hosts.yaml'}: hosts.{host.name}.fallbacks"),
            validate_ladders(o.fallbacks, source="--fallbacks"))
        if o.fault:
            from dfo_contract.faultspec import FaultSpecError, parse_spec

            try:
                parse_spec(o.fault, source="--fault")
            except FaultSpecError as e:   # the trainer's error, as dfo's (exit 2, one line)
                raise ConfigError(str(e).removeprefix("config: ")) from None
    policy = BudgetPolicy.from_user({**dict(o.budget), "scale": o.backoff_scale})
    run_id = o.run_id or make_run_id(run_name, now)
    return LaunchInputs(run_name=run_name, run_id=run_id, run_dir=tree.run_dir(run_id), now=now,
                        resume=resume, thresholds=thr, budget=policy, ladders=ladders,
                        trainer=trainer)


# --- --resume --------------------------------------------------------------------------

def parse_resume(value: str | None, root: str, *, own: bool = False) -> ResumeChoice:
    """``--resume`` as a :class:`ResumeChoice` (absent: scratch). Raises ConfigError for
    anything but a checkpoint name (``step_N``), ``latest``, or an absolute path under
    ``root`` with plain characters; ``own`` (your own trainer, ``-- CMD``): ``latest`` or
    an absolute path, as given."""
    if value is None:
        return ResumeChoice.scratch()
    if own:
        if value != "latest" and not value.startswith("/"):
            raise ConfigError(f"--resume {value!r}: with -- CMD use 'latest' or an absolute path")
        return ResumeChoice("latest" if value == "latest" else "path", value)
    v = value.strip()
    how = f"use a checkpoint name like step_690, 'latest', or a path under {root}"
    if v == "latest":
        return ResumeChoice("latest", v)
    if len(v) > RESUME_MAX:
        raise ConfigError(f"--resume: {value[:40]!r}... is too long", hint=how)
    if STEP_RE.fullmatch(v):
        return ResumeChoice("name", v)
    if v.startswith("/"):
        if not SAFE_PATH.fullmatch(v) or any(p == ".." for p in v.split("/")):
            raise ConfigError(f"--resume: {value!r} is not a plain path", hint=how)
        norm = posixpath.normpath(v)
        rootn = posixpath.normpath(root)
        if not (norm + "/").startswith(rootn.rstrip("/") + "/") or norm == rootn:
            raise ConfigError(f"--resume: {value!r} is outside the host's root {root}", hint=how)
        return ResumeChoice("path", norm)
    raise ConfigError(f"--resume: {value!r} is not a checkpoint name", hint=how)


# --- run names and --set --------------------------------------------------------------

def check_run_name(name: str, *, derived_from: str | None = None) -> str:
    """``name``, when it is a valid run name. ``derived_from``: the name was not given but
    taken from that (the config file's stem), so the error says where it came from."""
    if not RUN_NAME.fullmatch(name or ""):
        if derived_from is not None:
            raise ConfigError(f"the run name {name!r}, taken from {derived_from}, is not a valid "
                              "run name",
                              hint="give one with --run-name NAME (letters, digits, '.', '_' "
                                   "or '-', at most 48 characters), or rename the file")
        raise ConfigError(f"--run-name: {name!r} is not a valid run name",
                          hint="use letters, digits, '.', '_' or '-', at most 48 characters")
    return name


def parse_sets(items: Sequence[str]) -> list[tuple[str, str]]:
    """``--set train.micro_batch=4`` -> [("train.micro_batch", "4")]: checked keys, the
    values as typed (``runconfig.with_overrides`` coerces them by the trainer's rules)."""
    out: list[tuple[str, str]] = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE",
                              hint="e.g. --set train.micro_batch=4")
        k, v = item.split("=", 1)
        k = k.strip()
        if not SET_KEY.fullmatch(k):
            raise ConfigError(f"--set {item!r}: key must be SECTION.FIELD",
                              hint="e.g. --set compile.gate=false")
        if k in RESERVED_KEYS:
            raise ConfigError(f"--set {k}: set by dfo launch itself",
                              hint="use --run-name / --fault instead")
        out.append((k, v))
    return out
