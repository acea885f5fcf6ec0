"""``spec.json``: what ``dfo launch`` hands the run's supervisor (torch-free, stdlib only).

One versioned :class:`RunSpec` of frozen ``kw_only`` dataclasses, written once by launch
(``RunSpec.to_json``) and read by the supervisor only through :meth:`RunSpec.from_json`,
so the supervisor never re-reads hosts.yaml and never looks a key up by its name. Both go
through the records' codec (``dfo_contract.codec``): ``trainer`` and ``role`` are tagged
records, written with their ``kind`` first and read by it; ``thresholds`` and ``budget``
are then checked for each value's range (``Thresholds.check``, ``Budget.check``).

- ``identity``: the run (id, name), the host and where it lives (root, env python, run.lock)
- ``config``: the run config on the host, its flat values (file + defaults) and the
  ``--set`` overrides attempt 1 starts with (fallbacks change overrides, never the base)
- ``thresholds``, ``budget``: the watchdog's and the restart budget's limits (runlimits)
- ``ladders``: the bundled trainer's fallback ladders (failure class -> step names)
- ``resume``: the checkpoint dir and where attempt 1 starts (:class:`ResumeChoice`, resolved:
  from scratch or a checkpoint path; on disk ``path``, null for scratch)
- ``cache``: the compile-cache key and the run's cache env, the argv that re-seeds it
- ``standby``: the pre-started interpreter of the next attempt (on/off, its extra env)
- ``trainer``: :class:`Bundled` (``python -m trainer train``: its layout, process count and
  dense-path expectation, from the typed config) or :class:`Own` (an own command: its
  argv, directory, step pattern, env, resume rule and fallback steps)
- ``role``: :class:`Solo`, or :class:`Group` (one node of a run over several nodes)

A spec of another ``version``, or one the codec cannot read, is refused with one
:class:`ContractError` line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Union

from .codec import Tagged, decode, encode
from .errors import ContractError
from .own_ladder import LadderStep
from .runlimits import Budget, Thresholds

__all__ = ["SPEC_VERSION", "Budget", "Bundled", "Cache", "Config", "Group", "Identity", "Own",
           "ResumeRule", "Resume", "ResumeChoice", "RunSpec", "Solo", "Standby", "Thresholds", "NODE_LOST_S"]

SPEC_VERSION = 3
#: seconds without a heartbeat before the head of a group declares a node lost
NODE_LOST_S = 20.0


# --- the sections -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Identity:
    run_id: str
    run_name: str
    host: str              # the host's name in hosts.yaml
    root: str              # the host's dfo root
    python: str            # the deployed env's interpreter
    lock: str              # locks/run.lock (held by the live run's supervisor)



@dataclass(frozen=True, kw_only=True)
class Config:
    """The run config as ``dfo_contract.trainer_config`` loaded it on the laptop: ``base``
    is its flat ``SECTION.FIELD`` values without ``--set``, ``overrides`` the ``--set``s."""
    path: str
    base: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def merged(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The flat config in force with ``overrides`` (default: attempt 1's)."""
        return {**self.base, **(self.overrides if overrides is None else overrides)}



@dataclass(frozen=True)
class ResumeChoice:
    """Where attempt 1 starts (``dfo launch --resume``): ``scratch`` (no ``--resume``),
    ``latest`` (the newest valid checkpoint), ``name`` (a named step, ``value``: ``step_690``)
    or ``path`` (``value``: a checkpoint's absolute path). Launch resolves ``latest`` and
    ``name`` on the host to a ``path``: a run's spec carries scratch or a path."""
    kind: str           # "scratch" | "latest" | "name" | "path"
    value: str = ""     # "latest", "step_690", an absolute path; "" for scratch

    @classmethod
    def scratch(cls) -> "ResumeChoice":
        return cls("scratch")

    @classmethod
    def at(cls, path: str | None) -> "ResumeChoice":
        """A resolved choice: the checkpoint at ``path`` (None: from scratch)."""
        return cls("scratch") if path is None else cls("path", path)

    @property
    def is_scratch(self) -> bool:
        return self.kind == "scratch"

    @property
    def path(self) -> str | None:
        """The checkpoint path of a resolved choice (None: scratch, or not resolved yet)."""
        return self.value if self.kind == "path" else None


@dataclass(frozen=True, kw_only=True)
class Resume:
    checkpoint_dir: str           # where the trainer saves (your own trainer: the run dir)
    path: str | None = None       # what attempt 1 resumes from, checked by launch (None: scratch)

    @classmethod
    def of(cls, checkpoint_dir: str, start: ResumeChoice) -> "Resume":
        """The section for a resolved ``start`` (scratch or a path)."""
        if start.kind not in ("scratch", "path"):
            raise ContractError(f"resume: {start.kind} {start.value!r} is not resolved to a path")
        return cls(checkpoint_dir=checkpoint_dir, path=start.path)

    @property
    def start(self) -> ResumeChoice:
        """Where attempt 1 starts: scratch or the checkpoint at ``path``."""
        return ResumeChoice.at(self.path)



@dataclass(frozen=True, kw_only=True)
class Cache:
    key: str | None = None                    # None: unknown, or nothing is compiled
    env: Mapping[str, str] = field(default_factory=dict)   # the run's own cache dirs
    restore_argv: tuple[str, ...] | None = None  # re-seeds the run's cache (compile_gate retry)



@dataclass(frozen=True, kw_only=True)
class Standby:
    enabled: bool = True
    env: Mapping[str, str] = field(default_factory=dict)   # given to the standby only



@dataclass(frozen=True, kw_only=True)
class Bundled(Tagged):
    """``python -m trainer train`` (with ``DFO_FAULT`` when ``fault`` is given), and what
    the supervisor needs of its config, computed from the typed config (:meth:`of`):
    the parallel ``layout``, the processes of one attempt (``nproc``: ddp's one per distinct
    CUDA device, else 1) and whether flex's dense path is asked for (``dense_expected``:
    ``model.attention`` flex-eager, uncompiled flex on purpose)."""
    fault: str | None = None
    layout: str = "single"
    nproc: int = 1
    dense_expected: bool = False
    kind: ClassVar[str] = "bundled"

    @classmethod
    def of(cls, cfg: Any, fault: str | None = None) -> "Bundled":
        """The part of ``cfg`` (a ``dfo_contract.trainer_config.TrainerConfig``)."""
        p = cfg.parallel
        cuda = {d for d in p.drafter_devices if isinstance(d, str) and d.startswith("cuda")}
        return cls(fault=fault, layout=p.layout,
                   nproc=max(1, len(cuda)) if p.layout == "ddp" else 1,
                   dense_expected=cfg.model.attention == "flex-eager")



@dataclass(frozen=True, kw_only=True)
class ResumeRule:
    """Where your own trainer's checkpoints are and how it is told to resume one."""
    glob: str
    order: str = "step"                                 # "step" | "mtime"
    args: tuple[str, ...] = ("--resume", "{path}")



@dataclass(frozen=True, kw_only=True)
class Own(Tagged):
    """An own command (``dfo launch -- CMD ARGS...``); an argv, never a shell line."""
    command: tuple[str, ...]
    cwd: str | None = None                      # None: the run dir
    step_pattern: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    resume: ResumeRule | None = None
    #: failure class -> ladder steps (``orchestrator.common.own_trainer``: {"drop_arg": ...}, ...)
    fallbacks: Mapping[str, tuple[LadderStep, ...]] = field(default_factory=dict)
    kind: ClassVar[str] = "own"



@dataclass(frozen=True, kw_only=True)
class Solo(Tagged):
    kind: ClassVar[str] = "solo"



@dataclass(frozen=True, kw_only=True)
class Group(Tagged):
    """One node of a run over several nodes (``dfo launch --group``, docs/multinode.md)."""
    name: str                      # the group's name in hosts.yaml
    nodes: tuple[str, ...]         # host names, the head (node 0) first
    node: int                      # this node's index into ``nodes``
    head_addr: str                 # where the other nodes reach the head
    port: int                      # torchrun's c10d rendezvous (--rdzv-endpoint head_addr:port)
    coord_port: int                # the supervisors' TCPStore on the head
    nproc: int                     # processes on this node (--nproc-per-node)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # this node's extra env
    node_lost_s: float = NODE_LOST_S
    kind: ClassVar[str] = "group"

    @property
    def is_head(self) -> bool:
        return self.node == 0

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def host(self) -> str:
        return self.nodes[self.node]

    def rdzv_id(self, run_id: str, attempt: int) -> str:
        """A fresh rendezvous per attempt: a restarted attempt never meets a stale round."""
        return f"{run_id}-a{attempt}"


Trainer = Union[Bundled, Own]
Role = Union[Solo, Group]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    identity: Identity
    config: Config
    resume: Resume
    thresholds: Thresholds = field(default_factory=Thresholds)
    budget: Budget = field(default_factory=Budget)
    ladders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cache: Cache = field(default_factory=Cache)
    standby: Standby = field(default_factory=Standby)
    trainer: Trainer = field(default_factory=Bundled)
    role: Role = field(default_factory=Solo)
    version: int = SPEC_VERSION

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    @property
    def group(self) -> Group | None:
        return self.role if isinstance(self.role, Group) else None

    @property
    def own(self) -> Own | None:
        return self.trainer if isinstance(self.trainer, Own) else None

    @classmethod
    def from_json(cls, d: Any) -> "RunSpec":
        if not isinstance(d, Mapping):
            raise ContractError(f"spec.json: expected a JSON object, got {type(d).__name__}")
        v = d.get("version")
        if v != SPEC_VERSION:
            raise ContractError(f"spec.json: version {v!r} is not one this supervisor reads "
                                f"(it reads version {SPEC_VERSION}); launch the run again with "
                                "this dfo")
        spec = decode(cls, d, what="spec.json")
        spec.thresholds.check("spec.json's thresholds")
        spec.budget.check("spec.json's budget")
        return spec

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out
