"""A run's curves for ``dfo plot``: pure, from the text of ``metrics.jsonl`` and ``events.jsonl``.

- ``series``: one line per metric per attempt (an attempt that resumed from an earlier
  checkpoint re-logs steps the failed one already logged; drawn apart, the restart shows).
- ``boundaries``: where each attempt after the first starts (the step of the checkpoint it
  resumed, else its first logged step), labelled with what the supervisor changed for it:
  the ``fallback`` event of the attempt before (``class: step (key=value)``).
- ``PANELS``: which fields go into which picture; fields added to the metrics record later
  (``accept*``) join the acceptance panel by themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from dfo_contract import events as ev
from dfo_contract.metrics_record import MetricsRecord, parse_metrics

#: (panel title, fields drawn there, field prefixes that join it)
PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("loss", ("loss",), ()),
    ("acceptance", ("tau", "acc"), ("accept",)),
    ("throughput (tok/s)", ("tokens_per_s",), ()),
)

_STEP_DIR = re.compile(r"(?:^|/)step_(\d+)/?$")


@dataclass(frozen=True)
class Series:
    name: str
    attempt: int
    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Boundary:
    attempt: int
    step: int | None          # None: the attempt logged nothing and resumed nothing known
    label: str                # "attempt 2: oom -> halve_micro_batch (train.micro_batch=4)"


@dataclass
class Curves:
    run_id: str
    status: str | None
    panels: list[tuple[str, list[Series]]] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(s.steps for _, ss in self.panels for s in ss)


def _attempt(rec: MetricsRecord) -> int:
    return rec.attempt if rec.attempt is not None else 1


def series(records: Sequence[MetricsRecord], name: str) -> list[Series]:
    """``name`` per attempt, in the order attempts appear; points without a number left out."""
    by: dict[int, tuple[list[int], list[float]]] = {}
    for r in records:
        v = r.value(name)
        if v is None:
            continue
        steps, values = by.setdefault(_attempt(r), ([], []))
        steps.append(r.step)
        values.append(v)
    return [Series(name, a, tuple(s), tuple(v)) for a, (s, v) in by.items()]


def fallback_label(fb: ev.Fallback) -> str:
    """``oom -> halve_micro_batch (train.micro_batch=4)``; ``crash -> same config``."""
    cls = fb.cls or "?"
    step = fb.step
    what = step if step and step != "same" else "same config"
    changed = fb.changed or {}
    text = f"{cls} -> {what}"
    if changed:
        text += " (" + ", ".join(f"{k}={v}" for k, v in changed.items()) + ")"
    return text


def resumed_step(resume: Any) -> int | None:
    """The step of a checkpoint path ``.../step_120`` (None for anything else)."""
    if not isinstance(resume, str):
        return None
    m = _STEP_DIR.search(resume.rstrip("/"))
    return int(m.group(1)) if m else None


def boundaries(events: Sequence[ev.Event],
               records: Sequence[MetricsRecord]) -> list[Boundary]:
    """Each attempt after the first: where it starts and what changed for it."""
    first_step: dict[int, int] = {}
    for r in records:
        first_step.setdefault(_attempt(r), r.step)
    fallbacks = {e.attempt: e for e in events if isinstance(e, ev.Fallback)}
    starts: dict[int, ev.AttemptStart] = {}
    for e in events:
        if isinstance(e, ev.AttemptStart):
            starts.setdefault(e.attempt, e)
    attempts = sorted((set(starts) | set(first_step)) - {1})
    attempts = [a for a in attempts if a > 1]
    out = []
    for a in attempts:
        step = resumed_step(starts[a].resume if a in starts else None)
        if step is None:
            step = first_step.get(a)
        label = f"attempt {a}"
        fb = fallbacks.get(a - 1)
        if fb is not None:
            label += ": " + fallback_label(fb)
        out.append(Boundary(a, step, label))
    return out


def final_status(events: Sequence[ev.Event]) -> str | None:
    finals = [e for e in events if isinstance(e, ev.Final)]
    return str(finals[-1].status) if finals else None


def curves(run_id: str, metrics_text: str, events_text: str) -> Curves:
    """ContractError when events_text holds a record this dfo cannot read (a newer one)."""
    records = parse_metrics(metrics_text)
    events = ev.read_events(events_text)
    fields_seen: list[str] = []
    for r in records:
        for k in r.names():
            if k not in fields_seen:
                fields_seen.append(k)
    out = Curves(run_id, final_status(events))
    for title, names, prefixes in PANELS:
        wanted = list(names) + [k for k in fields_seen
                                if k not in names and k.startswith(prefixes)]
        ss = [s for n in wanted for s in series(records, n)]
        out.panels.append((title, ss))
    out.boundaries = boundaries(events, records)
    return out
