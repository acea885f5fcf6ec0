"""``dfo launch``'s --threshold, --budget and --fallbacks, read by click parameter types
(orchestrator.cli.params): the values launch gets, and launch's one-line errors."""

from __future__ import annotations

import click
import pytest

from orchestrator.cli import params as pm
from orchestrator.cli.run import launch
from orchestrator.common.errors import ConfigError


def _values(args: list[str]) -> dict:
    ctx = launch.make_context("launch", [*args, "--dry-run"])
    return ctx.params


def test_the_command_gets_the_folded_values():
    p = _values(["--threshold", "train_s=5", "--threshold", "warmup_s=1e2",
                 "--budget", "total=3", "--budget", "crash=1", "--budget", "startup_limit=2",
                 "--fallbacks", "oom=halve_micro_batch*, ,compile_gate"])
    assert p["thresholds"] == {"train_s": 5.0, "warmup_s": 100.0}
    assert p["budget"] == {"total": 3, "startup_limit": 2, "per_class": {"crash": 1}}
    assert p["fallbacks"] == {"oom": ["halve_micro_batch*", "compile_gate"]}
    none = _values([])
    assert (none["thresholds"], none["budget"], none["fallbacks"]) == ({}, {}, None)


@pytest.mark.parametrize("args, want", [
    (["--budget", "x"], "--budget 'x': expected KEY=VALUE"),
    (["--budget", "crash=1.5"], "--budget 'crash=1.5': '1.5' is not a number"),
    (["--threshold", "train_s"], "--threshold 'train_s': expected KEY=VALUE"),
    (["--threshold", "train_s=abc"], "--threshold 'train_s=abc': 'abc' is not a number"),
    (["--fallbacks", "oom"], "--fallbacks 'oom': expected CLASS=STEP,STEP"),
])
def test_a_bad_value_is_launchs_one_line_config_error(args, want):
    with pytest.raises(ConfigError) as e:
        _values(args)
    assert str(e.value) == want and e.value.exit_code == 2


def test_a_converted_value_passes_through():
    assert pm.BUDGET.convert(("crash", 1), None, None) == ("crash", 1)
    assert isinstance(pm.LADDER, click.ParamType)
