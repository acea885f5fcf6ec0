"""What ``dfo launch`` was asked, checked before the host is asked anything (pure): the
options (:class:`LaunchOptions`), the trainer's input (:class:`BundledConfig`, the run
config as loaded once; ``launch_own.OwnConfig``, a foreign trainer's run file and flags) and
``prepare``, which checks them (``--resume`` text, ``--set``, ladders, budget, thresholds,
``--fault``) and names the run -> :class:`LaunchInputs` (``ops.launch_plan`` plans from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from dfo_contract.runspec import Budget, Thresholds

from ..errors import ConfigError
from .budget import BudgetPolicy
from .fallback import merge_ladders, validate_ladders
from .launch_inputs import ResumeArg, check_run_name, flatten, parse_resume
from .launch_own import OwnConfig
from .run_identity import make_run_id
from .thresholds import thresholds as check_thresholds


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
    #: a foreign trainer (``dfo launch -- CMD ARGS...``, ops.launch_own)
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
        """A foreign trainer (``-- CMD``, a run file, or its flags)."""
        return bool(self.command or self.run_file or self.resume_glob or self.ladder)


@dataclass(frozen=True, kw_only=True)
class BundledConfig:
    """The bundled trainer's run config as launch loaded it (one read of the file)."""
    source: str | None          # --config (None: the host's default run config)
    name: str                   # the file's stem: the default run name
    base: Mapping[str, Any]     # flat: the file over the trainer's defaults, without --set
    sets: Mapping[str, Any]     # --set, parsed
    full: Mapping[str, Any]     # nested, with --set, validated by the trainer's rules
    data: bytes                 # the file, shipped as the run's config.yaml
    #: the keys the file or --set gives (a ``model.init_from`` drafter fills the others)
    explicit: frozenset[str] = frozenset()

    @property
    def flat(self) -> dict[str, Any]:
        return {**self.base, **self.sets}

    @property
    def compiled(self) -> bool:
        return bool((self.full.get("compile") or {}).get("enabled", True))


TrainerInput = Union[BundledConfig, OwnConfig]


@dataclass(frozen=True, kw_only=True)
class LaunchInputs:
    """Everything launch checked before it touched the host."""
    run_name: str
    run_id: str
    run_dir: str
    now: float                    # when launch was asked (the run id's time)
    resume: ResumeArg | None      # the bundled trainer's --resume (a foreign one: the text)
    thresholds: Thresholds
    budget: Budget
    ladders: Mapping[str, list[str]]
    trainer: TrainerInput


def prepare(o: LaunchOptions, trainer: TrainerInput, host, now: float) -> LaunchInputs:
    """Check ``o`` and ``trainer`` for ``host`` (a HostConfig); name the run."""
    lay = host.layout
    resume = None if isinstance(trainer, OwnConfig) else parse_resume(o.resume, lay.root)
    if resume is not None and o.new_lineage:
        raise ConfigError("--new-lineage starts over; it cannot be combined with --resume",
                          hint="drop one of the two")
    if o.run_name is None:   # a foreign trainer's name is made valid from its command
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
    policy = BudgetPolicy.from_json({**dict(o.budget), "scale": o.backoff_scale})
    run_id = o.run_id or make_run_id(run_name, now)
    return LaunchInputs(run_name=run_name, run_id=run_id, run_dir=lay.run_dir(run_id), now=now,
                        resume=resume, thresholds=thr, budget=policy, ladders=ladders,
                        trainer=trainer)


def bundled_config(o: LaunchOptions, name: str, sets: Mapping[str, Any],
                   layers) -> BundledConfig:
    """The run config as ``config.runconfig.load_layers`` loaded it (``layers``: its
    ``RunLayers``) with ``sets`` (``o``'s ``--set``, parsed)."""
    return BundledConfig(source=o.config, name=name, base=flatten(layers.base), sets=dict(sets),
                         full=layers.full, data=layers.data, explicit=layers.explicit)
