"""The supervisor's thresholds (``dfo launch --threshold K=V``): defaults and validation. Pure."""

from __future__ import annotations

import math
from typing import Mapping

from ..errors import ConfigError


DEFAULT_THRESHOLDS: dict[str, float] = {
    "warmup_s": 900.0,        # no heartbeat/step before the first training step
    "train_s": 300.0,         # no step (or heartbeat) once training
    "hang_s": 60.0,           # no heartbeat/step and an idle process tree: stuck (0: off)
    "stop_timeout_s": 120.0,  # SIGTERM -> checkpoint -> exit, before SIGKILL
    "kill_grace_s": 10.0,     # after a failure was seen, before SIGKILL
    "live_grace_s": 5.0,      # a fatal pattern was printed: let the trainer exit by itself
    "collapse_fraction": 0.5,
    "collapse_steps": 5,
    "baseline_steps": 5,
    "skip_steps": 2,
    "poll_s": 0.2,
    "standby_wait_s": 0.0,    # wait this long for a standby still importing (0: never)
    "standby_early_cpus": 8,  # hosts with >= this many CPUs start the standby with the attempt (0: never)
}


ZERO_OK = ("skip_steps", "hang_s", "standby_wait_s", "standby_early_cpus")  # 0 means "off"


def thresholds(overrides: Mapping[str, float] | None = None, *, scale: float = 1.0) -> dict:
    t = dict(DEFAULT_THRESHOLDS)
    for k, v in (overrides or {}).items():
        if k not in t:
            raise ConfigError(f"threshold {k!r} is unknown", hint="known: " + ", ".join(t))
        v = float(v)
        if not math.isfinite(v) or v < 0 or (v == 0 and k not in ZERO_OK):
            raise ConfigError(f"--threshold {k}={v}: expected a positive number of seconds")
        t[k] = v
    return t
