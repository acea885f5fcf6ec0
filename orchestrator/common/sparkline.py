"""Pure: a small unicode sparkline (``▁▂▃▄▅▆▇█``) of recent values, for ``dfo status``."""

from __future__ import annotations

import math
from typing import Iterable

from dfo_contract.metrics_record import MetricsRecord

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[object], width: int = 8) -> str:
    """The last ``width`` finite numbers of ``values`` as bars scaled between their min and
    max (all equal: a flat middle line). Non-numbers, NaN and inf are skipped; no numbers: ''."""
    xs = [float(v) for v in values
          if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    xs = xs[-width:] if width > 0 else []
    if not xs:
        return ""
    lo, hi = min(xs), max(xs)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return BARS[len(BARS) // 2 - 1] * len(xs)
    top = len(BARS) - 1
    return "".join(BARS[round((x - lo) / (hi - lo) * top)] for x in xs)


def current_step(*steps: object) -> int | None:
    """The newest step among the sources that know one (state.json's last step, the newest
    step record in metrics.jsonl, the newest checkpoint): their maximum, or None."""
    got = [int(s) for s in steps if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
    return max(got) if got else None


def metrics_tail(records: Iterable[MetricsRecord],
                 keep: int = 16) -> tuple[int | None, list[float]]:
    """From the last records of metrics.jsonl (``dfo_contract.metrics_record``): the step
    of the newest one and the last ``keep`` finite tokens_per_s values."""
    step = None
    tps: list[float] = []
    for rec in records:
        step = rec.step
        v = rec.value("tokens_per_s")
        if v is not None:
            tps.append(v)
    return step, tps[-keep:]
