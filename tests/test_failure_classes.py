"""A failure class is one row of ``dfo_contract.failure_classes.TABLE``: the classifier's
order, the permanent and transient sets, the ladders, the budgets, an own command's retries
and ``dfo diagnose``'s collectives are each derived from the rows, so a new class is one row
(plus its rules, docs and fixture)."""

from __future__ import annotations

import dataclasses

import pytest

from dfo_contract.own_ladder import LadderStep
from dfo_contract import failure_classes as fc
from dfo_contract import runlimits
from dfo_contract.errors import ContractError
from dfo_contract.failure_classes import TABLE, TABLES, FailureClass, derive
from orchestrator.config import hostconfig, inventory, inventory_parser
from orchestrator.engine import diagnose
from orchestrator.common import budget, classify_rules, fallback, own_trainer, verdict

TOY = FailureClass(name="toy_stall", priority=0, kind="transient", budget=2, ladder=("same",),
                   own_retry=True, own_ladder=(LadderStep(env={"TOY": "1"}),), collective=True)


def test_every_per_class_table_is_the_rows():
    assert classify_rules.CLASSES == TABLES.classes == (*(r.name for r in TABLE), "done")
    assert classify_rules.PRIORITY == TABLES.priority
    assert classify_rules.PERMANENT_CLASSES == TABLES.permanent == {"disk_full", "read_only"}
    assert fallback.TRANSIENT == TABLES.transient
    assert fallback.DEFAULT_LADDERS == {r.name: list(r.ladder) for r in TABLE}
    assert runlimits.DEFAULT_PER_CLASS == {r.name: r.budget for r in TABLE}
    assert runlimits.Budget().per_class == runlimits.DEFAULT_PER_CLASS
    assert verdict.OWN_RETRY == TABLES.own_retry == {"fx_trace_race", "compile_hang"}
    assert verdict.OWN_DEFAULT == TABLES.own_ladders
    assert diagnose.COLLECTIVE_CLASSES == TABLES.collective
    # one tuple of failure classes, whoever names it
    for mod in (fallback, inventory, inventory_parser, own_trainer, budget):
        assert mod.FAILURE_CLASSES is fc.FAILURE_CLASSES, mod.__name__
    assert not hasattr(hostconfig, "FAILURE_CLASSES")


def test_the_priority_order_is_the_documented_one():
    assert TABLES.priority == ("disk_full", "read_only", "fx_trace_race", "oom", "compile_resources",
                               "compile_workers", "warmup_collective", "nccl_timeout", "nan_loss",
                               "frozen", "compile_hang", "dense_fallback", "compile_error", "crash")


def test_a_new_class_is_one_row():
    t = derive((*TABLE, TOY))
    assert t.classes == (*TABLES.failure_classes, "toy_stall", "done")
    assert t.failure_classes == (*TABLES.failure_classes, "toy_stall")
    assert t.priority == ("toy_stall", *TABLES.priority)      # priority 0: before every other
    assert t.transient == TABLES.transient | {"toy_stall"} and t.permanent == TABLES.permanent
    assert t.ladders == {**TABLES.ladders, "toy_stall": ("same",)}
    assert t.budgets == {**TABLES.budgets, "toy_stall": 2}
    assert t.own_retry == TABLES.own_retry | {"toy_stall"}
    assert t.own_ladders == {**TABLES.own_ladders, "toy_stall": (LadderStep(env={"TOY": "1"}),)}
    assert t.collective == TABLES.collective | {"toy_stall"}
    # what is given per class (spec.json's budget, a run's --fallbacks) takes the new name
    b = runlimits.Budget.from_user({"per_class": {"toy_stall": 1}}, classes=t.failure_classes)
    assert b.per_class["toy_stall"] == 1
    with pytest.raises(ContractError, match="unknown failure class 'toy_stall'"):
        runlimits.Budget.from_user({"per_class": {"toy_stall": 1}}, classes=TABLES.failure_classes)
    # a class whose row says "permanent" is permanent, with nothing else to change
    p = derive((*TABLE, FailureClass(name="toy_gone", priority=99, kind="permanent", budget=0)))
    assert p.permanent == TABLES.permanent | {"toy_gone"} and p.ladders["toy_gone"] == ()
    assert p.priority[-1] == "toy_gone"


@pytest.mark.parametrize("row, why", [
    (dataclasses.replace(TABLE[0], priority=99), "given twice"),
    (dataclasses.replace(TOY, name="done"), "given twice or is 'done'"),
    (dataclasses.replace(TOY, priority=TABLE[0].priority), "share a priority"),
    (dataclasses.replace(TOY, kind="sometimes"), "kind 'sometimes' is not one of"),
    (dataclasses.replace(TOY, budget=-1), "negative"),
    (dataclasses.replace(TOY, kind="permanent", own_retry=False, own_ladder=()), "permanent class"),
])
def test_a_table_that_contradicts_itself_is_refused(row, why):
    with pytest.raises(ContractError, match=why):
        derive((*TABLE, row))


def test_every_default_ladder_step_is_a_fallback_step():
    for row in TABLE:
        for step in row.ladder:
            assert step.rstrip("*") in fallback.STEPS, (row.name, step)


def test_every_evidence_rule_gives_a_class_of_the_table():
    assert classify_rules.RULES
    for rule in classify_rules.RULES:
        assert rule.cls in TABLES.failure_classes, rule.name
