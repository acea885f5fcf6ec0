"""The fault-injection spec, torch-free: ``KIND[=ARG]@STEP[#ATTEMPT]`` items, comma-separated.

The trainer injects the faults (``trainer.telemetry.faults``); ``dfo launch --fault`` and the
trainer's config validate the spec with this parser before anything starts.
See docs/contracts.md, "Fault injection".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import envvars
from .exitcodes import TrainerConfigError

ENV_VAR = envvars.FAULT
KINDS = ("fx_race", "hang", "oom", "exit", "sigkill", "slow", "nan")
_ARG_KINDS = {"exit", "slow"}
_ITEM = re.compile(r"^(?P<kind>[a-z_]+)(?:=(?P<arg>[^@#]*))?@(?P<step>[^#]*)(?:#(?P<attempt>.*))?$")
FX_RACE_TEXT = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


class FaultSpecError(TrainerConfigError):
    """A malformed fault spec; ``str()`` is one line naming the bad item and the fix."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    attempt: int | None = 1  # None = every attempt
    arg: float | int | None = None

    @property
    def value(self) -> float | int:
        """The argument of a kind that takes one (``exit=N``, ``slow=F``: the parser requires
        it)."""
        if self.arg is None:
            raise FaultSpecError(f"fault {self}: {self.kind} needs an argument")
        return self.arg

    def matches(self, step: int, attempt: int) -> bool:
        return step == self.step and (self.attempt is None or self.attempt == attempt)

    def __str__(self) -> str:
        a = "" if self.arg is None else f"={self.arg}"
        at = "*" if self.attempt is None else str(self.attempt)
        return f"{self.kind}{a}@{self.step}#{at}"


def parse_spec(spec: str | None, *, source: str = "--fault.spec") -> list[Fault]:
    """Parse a spec string into faults. Empty/None -> []. Raises FaultSpecError."""
    if spec is None or not spec.strip():
        return []
    faults = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise FaultSpecError(f"config: {source}: empty item in {spec!r} "
                                 "(use comma-separated KIND[=ARG]@STEP[#ATTEMPT])")
        faults.append(_parse_item(item, source))
    return faults


def _parse_item(item: str, source: str) -> Fault:
    def bad(why: str) -> FaultSpecError:
        return FaultSpecError(f"config: {source}: {item!r}: {why} "
                              "(expected KIND[=ARG]@STEP[#ATTEMPT], e.g. fx_race@5 or exit=3@2#*)")
    m = _ITEM.match(item)
    if not m:
        raise bad("not of the form KIND[=ARG]@STEP[#ATTEMPT]")
    kind, arg_s, step_s, att_s = m["kind"], m["arg"], m["step"], m["attempt"]
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    if kind in _ARG_KINDS and arg_s is None:
        raise bad(f"{kind} needs an argument ({kind}=N)" if kind == "exit" else f"{kind} needs an argument (slow=F, 0<F<1)")
    if kind not in _ARG_KINDS and arg_s is not None:
        raise bad(f"{kind} takes no argument")
    if not step_s.isdigit():
        raise bad(f"step must be a non-negative integer, got {step_s!r}")
    step = int(step_s)
    if att_s is None:
        attempt: int | None = 1
    elif att_s == "*":
        attempt = None
    elif att_s.isdigit() and int(att_s) >= 1:
        attempt = int(att_s)
    else:
        raise bad(f"attempt must be a positive integer or *, got {att_s!r}")
    arg: float | int | None = None
    if kind == "exit":
        if not (arg_s.isdigit() and 0 <= int(arg_s) <= 255):
            raise bad(f"exit code must be an integer 0..255, got {arg_s!r}")
        arg = int(arg_s)
    elif kind == "slow":
        try:
            arg = float(arg_s)
        except ValueError:
            raise bad(f"slow fraction must be a number, got {arg_s!r}") from None
        if not 0.0 < arg < 1.0:
            raise bad(f"slow fraction must be in (0, 1), got {arg_s!r}")
    return Fault(kind=kind, step=step, attempt=attempt, arg=arg)


def resolve_spec(flag_value: str | None, env_value: str | None) -> str | None:
    """The active spec text: the ``--fault.spec`` flag if set, else ``env_value``
    (``$DFO_FAULT``, which the caller read)."""
    if flag_value is not None and str(flag_value).strip():
        return str(flag_value)
    return env_value if env_value is not None and env_value.strip() else None


def parse_attempt(text: str | None) -> int:
    """An attempt number from ``$DFO_ATTEMPT``'s text (1-based; 1 when unset or malformed)."""
    try:
        return max(1, int(text if text is not None else "1"))
    except ValueError:
        return 1
