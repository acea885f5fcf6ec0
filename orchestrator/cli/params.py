"""Click parameter types dfo's commands share."""

from __future__ import annotations

import math
from typing import Any, Callable

import click

from ..common.errors import ConfigError


class Seconds(click.ParamType):
    """A finite number of seconds (or a finite factor): ``nan`` and ``inf`` are refused,
    since a timeout or backoff of either would never end."""

    name = "SECONDS"

    def __init__(self, *, allow_zero: bool = False):
        self.allow_zero = allow_zero

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            x = float(value)
        else:
            try:
                x = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if x < 0 or (x == 0 and not self.allow_zero):
            bound = ">= 0" if self.allow_zero else "> 0"
            self.fail(f"{value!r} must be {bound}", param, ctx)
        return x


POSITIVE_SECONDS = Seconds()
NON_NEGATIVE = Seconds(allow_zero=True)


class FaultSpec(click.ParamType):
    """A fault-injection spec (``KIND[=ARG]@STEP[#ATTEMPT]``, comma-separated), checked
    when the command line is read: a bad one is a one-line usage error before anything runs
    (a demo's deploy and warm-cache included)."""

    name = "SPEC"

    def convert(self, value, param, ctx):
        from dfo_contract.faultspec import FaultSpecError, parse_spec

        try:
            parse_spec(str(value), source="")
        except FaultSpecError as e:
            self.fail(str(e).split(": ", 2)[-1], param, ctx)
        return str(value)


FAULT_SPEC = FaultSpec()


class KeyNumber(click.ParamType):
    """``KEY=NUMBER`` of a repeatable option (``--threshold NAME=SECONDS``, ``--budget
    CLASS=N``) -> ``(key, number)``. A bad one is launch's one-line ConfigError (exit 2),
    naming the option and the item as given."""

    name = "KEY=NUMBER"

    def __init__(self, option: str, number: Callable[[str], Any] = float):
        self.option, self.number = option, number

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        item = str(value)
        if "=" not in item:
            raise ConfigError(f"{self.option} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            return k.strip(), self.number(v)
        except ValueError:
            raise ConfigError(f"{self.option} {item!r}: {v!r} is not a number") from None


class Ladder(click.ParamType):
    """``--fallbacks CLASS=STEP,STEP`` -> ``(class, [step, ...])`` (empty steps dropped)."""

    name = "CLASS=STEP,STEP"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        item = str(value)
        if "=" not in item:
            raise ConfigError(f"--fallbacks {item!r}: expected CLASS=STEP,STEP")
        k, v = item.split("=", 1)
        return k.strip(), [s.strip() for s in v.split(",") if s.strip()]


THRESHOLD = KeyNumber("--threshold")
BUDGET = KeyNumber("--budget", int)
LADDER = Ladder()

#: the keys of ``--budget`` that are not a failure class
BUDGET_TOTALS = ("total", "startup_limit")


def as_thresholds(ctx, param, pairs) -> dict[str, float]:
    """``--threshold`` given: name -> seconds (a later one wins)."""
    return dict(pairs)


def as_budget(ctx, param, pairs) -> dict[str, Any]:
    """``--budget`` given: ``total`` and ``startup_limit`` as they are, the failure classes'
    restarts under ``per_class`` (``BudgetPolicy.from_user``'s shape)."""
    budget: dict[str, Any] = {}
    per: dict[str, int] = {}
    for k, v in pairs:
        if k in BUDGET_TOTALS:
            budget[k] = v
        else:
            per[k] = v
    if per:
        budget["per_class"] = per
    return budget


def as_ladders(ctx, param, pairs) -> dict[str, list[str]] | None:
    """``--fallbacks`` given: class -> its ladder (None: none given)."""
    return dict(pairs) or None


def group_option(verb: str):
    """``--group NAME``: do ``verb`` on every member of a hosts.yaml group, in parallel."""
    return click.option("--group", "group_name", default=None, metavar="NAME",
                        help=f"{verb} on every host of this hosts.yaml group, in parallel "
                             f"(a row per host, then a summary; not with --host).")


def host_or_group(host_name: str | None, group_name: str | None) -> None:
    """``--host`` and ``--group`` name different things: refuse both at once (one line)."""
    if host_name is not None and group_name is not None:
        raise click.UsageError("--host and --group cannot be combined: give one "
                               "(--group acts on every host of the group)")
