"""The failure classes: one row each, and every per-class table derived from the rows
(torch-free, stdlib only; docs/recovery.md).

A row says how the supervisor treats an attempt that ended with that class: where the class
stands when several have evidence (``priority``), whether a restart can help (``kind``), the
bundled trainer's fallback ladder, the restart budget, and what an own command
(``dfo launch -- CMD``) gets. The classifier's order (``orchestrator.common.classify_rules``),
the ladders (``orchestrator.common.fallback``), the budgets (``dfo_contract.runlimits``), the own
command's retries (``orchestrator.common.verdict``) and ``dfo diagnose``'s collectives are all
read from :data:`TABLES`. A new class is one row here, plus the rules that give a line its
class (``classify_rules.RULES``), its docs and a recorded log fixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

from .errors import ContractError
from .own_ladder import LadderStep

#: the class of an attempt that exited 0 (not a failure: no row)
DONE = "done"

#: what a restart can do for a class:
#: ``ladder``: each restart applies the next step of its ladder; spent, the run ends failed;
#: ``transient``: its ladder spent, it restarts with the same config (its count resets after
#: healthy training); ``permanent``: no restart helps, the run stops at once
Kind = Literal["ladder", "transient", "permanent"]
KINDS: tuple[str, ...] = ("ladder", "transient", "permanent")


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    name: str
    #: when several classes have evidence, the lowest priority wins
    priority: int
    kind: Kind
    #: restarts allowed before the run ends failed (spec.json's ``budget.per_class``)
    budget: int
    #: the bundled trainer's fallback steps (``orchestrator.common.fallback.STEPS``; ``NAME*``
    #: repeats while it still changes the config)
    ladder: tuple[str, ...] = ()
    #: an own command restarts unchanged once its run file's ladder is spent
    own_retry: bool = False
    #: an own command's steps when its run file has no ladder for the class
    own_ladder: tuple[LadderStep, ...] = ()
    #: the evidence is a collective's: ``dfo diagnose`` reads the log as a multi-process run's
    collective: bool = False


#: the bundled trainer's ladder for a failed or stuck compile
COMPILE_LADDER = ("target_compile_off", "compile_gate", "layout_ddp", "one_drafter_device",
                  "attention_sdpa")

TABLE: tuple[FailureClass, ...] = (
    # the threaded lazy-compile race (docs/recovery.md): an own command retries it unchanged
    FailureClass(name="fx_trace_race", priority=3, kind="ladder", budget=5,
                 ladder=COMPILE_LADDER, own_retry=True),
    FailureClass(name="compile_hang", priority=11, kind="ladder", budget=5,
                 ladder=COMPILE_LADDER, own_retry=True),
    FailureClass(name="dense_fallback", priority=12, kind="ladder", budget=5,
                 ladder=COMPILE_LADDER),
    # deterministic compile failures: each has its cure, and no restart unchanged
    FailureClass(name="compile_resources", priority=5, kind="ladder", budget=4,
                 ladder=("flex_smaller_blocks*", "attention_sdpa")),
    FailureClass(name="compile_workers", priority=6, kind="ladder", budget=1,
                 ladder=("compile_threads_one",),
                 own_ladder=(LadderStep(env={"TORCHINDUCTOR_COMPILE_THREADS": "1"}),)),
    # any other failed compile: the target's compile first (the drafter's stays)
    FailureClass(name="compile_error", priority=13, kind="transient", budget=3,
                 ladder=("target_compile_off",)),
    FailureClass(name="oom", priority=4, kind="ladder", budget=6,
                 ladder=("halve_micro_batch*", "halve_anchors*")),
    FailureClass(name="warmup_collective", priority=7, kind="ladder", budget=1,
                 ladder=("warmup_sync",), collective=True),
    FailureClass(name="nccl_timeout", priority=8, kind="transient", budget=5, collective=True),
    FailureClass(name="nan_loss", priority=9, kind="ladder", budget=3,
                 ladder=("same", "halve_lr*")),
    # someone stopped the process: nothing in the config did it
    FailureClass(name="frozen", priority=10, kind="transient", budget=3),
    FailureClass(name="disk_full", priority=1, kind="permanent", budget=0),
    FailureClass(name="read_only", priority=2, kind="permanent", budget=0),
    # nothing says the config caused it: the same config again
    FailureClass(name="crash", priority=14, kind="transient", budget=3),
)


@dataclass(frozen=True)
class Tables:
    """Every per-class table, derived from the rows (:func:`derive`)."""
    #: every class the classifier gives, in the rows' order, ``done`` last
    classes: tuple[str, ...]
    #: the classes of a failed attempt (a ladder, budget or ``--ladder`` names one of these)
    failure_classes: tuple[str, ...]
    #: the classes by priority, most specific first
    priority: tuple[str, ...]
    permanent: frozenset[str]
    transient: frozenset[str]
    ladders: Mapping[str, tuple[str, ...]]
    budgets: Mapping[str, int]
    own_retry: frozenset[str]
    own_ladders: Mapping[str, tuple[LadderStep, ...]]
    collective: frozenset[str]


def derive(rows: Sequence[FailureClass]) -> Tables:
    """The tables of ``rows``; ContractError for a table that contradicts itself."""
    names = [r.name for r in rows]
    if len(set(names)) != len(names) or DONE in names:
        raise ContractError(f"failure classes: a name is given twice or is {DONE!r}: {names}")
    ranks = [r.priority for r in rows]
    if len(set(ranks)) != len(ranks):
        raise ContractError(f"failure classes: two classes share a priority: {sorted(ranks)}")
    for r in rows:
        if r.kind not in KINDS:
            raise ContractError(f"failure class {r.name}: kind {r.kind!r} is not one of "
                                f"{', '.join(KINDS)}")
        if r.budget < 0:
            raise ContractError(f"failure class {r.name}: budget {r.budget} is negative")
        if r.kind == "permanent" and (r.ladder or r.budget or r.own_retry or r.own_ladder):
            raise ContractError(f"failure class {r.name}: a permanent class has no ladder, "
                                "retry or budget")
    return Tables(
        classes=(*names, DONE),
        failure_classes=tuple(names),
        priority=tuple(r.name for r in sorted(rows, key=lambda r: r.priority)),
        permanent=frozenset(r.name for r in rows if r.kind == "permanent"),
        transient=frozenset(r.name for r in rows if r.kind == "transient"),
        ladders={r.name: r.ladder for r in rows},
        budgets={r.name: r.budget for r in rows},
        own_retry=frozenset(r.name for r in rows if r.own_retry),
        own_ladders={r.name: r.own_ladder for r in rows if r.own_ladder},
        collective=frozenset(r.name for r in rows if r.collective),
    )


TABLES = derive(TABLE)
FAILURE_CLASSES = TABLES.failure_classes
