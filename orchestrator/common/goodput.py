"""Where a run's wall time went: goodput and the time lost per cause, from its events alone.

``account(events, now=None)`` is the one place this is computed (``dfo status --json``'s
``time``, the ``final`` event's ``goodput``/``lost_s``, the demo's recap); what it gives is the
record ``dfo_contract.goodput.Goodput``. Pure: it reads the records of one ``events.jsonl``
and nothing else.

The run's wall time runs from its (first) ``supervisor_start`` to its ``final`` (a live run:
to ``now``). Training time is the time spent in training steps that count; the rest is lost,
per cause:

- ``startup``: before the first attempt (the run's cache copy) and, in every attempt, from its
  start to the trainer's training loop (interpreter, imports, model, data, resume);
- ``compile``: the trainer's warm-up compile, and the part of the time up to the first step
  report that the steps themselves do not explain (a lazy compile in the first step);
- ``detection``: in a failed attempt, from when the failure showed (the watchdog's first
  event in it, else its last step report) to its end (the error and the exit, or the
  watchdog's wait and kill);
- ``restart``: between one attempt's end and the next one's start (backoff, cache restore);
- ``redone``: the steps a failed attempt trained past the checkpoint the next one resumed
  from (trained twice), including those after its last step report until the failure showed;
- ``other``: what is left (the final save after the last step report, the end of the run).

The figures per attempt come from the optional timing fields of ``attempt_end``
(``loop_t``, ``warmup_s``, ``from_step``, ``first_step``/``first_step_t``,
``last_step``/``last_step_t``). Attempts recorded without them (events written before the
fields existed, your own trainer without markers) are estimated from their checkpoint
events: the time to the first checkpoint less its steps counts as start-up, and a failed
attempt with no checkpoint counts whole as ``redone`` (if it trained) or ``startup``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Sequence

from dfo_contract import events as ev
from dfo_contract.goodput import CAUSES, Goodput
from dfo_contract.trainer_markers import StartupMarker, StepMarker, TrainerMarker

def last_run(evs: Sequence[ev.Event]) -> list[ev.Event]:
    """The records of the newest run in ``evs`` (from its first ``supervisor_start`` that is
    not a supervisor's restart; a supervisor restarted mid-run continues the same run)."""
    start = 0
    for i, e in enumerate(evs):
        if isinstance(e, ev.SupervisorStart) and not e.resumed:
            start = i
    return list(evs[start:])


def steady(evs: Sequence[ev.Event],
           mono: float | None = None) -> tuple[list[ev.Event], float | None]:
    """``evs`` on a timeline that a step of the wall clock does not move: each record the
    supervisor stamped with its monotonic clock (``mono``) is placed at the first stamped
    record's ``t`` plus the monotonic time since; one without a stamp keeps its place
    relative to the record before it; the trainer's times in an ``attempt_end`` move with
    its attempt's start (the watch reads them against that start). A monotonic clock that
    went back (a reboot) starts a new anchor. Also returns ``mono`` (the reader's monotonic
    now, of the same boot) on that timeline, None when it cannot be placed. The order of the
    records is kept: a record is never before the one written before it."""
    out: list[ev.Event] = []
    anchor: tuple[float, float] | None = None    # (timeline t, mono) of the anchor record
    last_mono: float | None = None
    shift = 0.0
    prev: float | None = None
    start_shift: dict[int, float] = {}
    for e in evs:
        if e.mono is not None and anchor is not None and last_mono is not None \
                and e.mono >= last_mono:
            t = anchor[0] + (e.mono - anchor[1])
        elif e.mono is not None:
            t = e.t if prev is None else max(e.t, prev)
            anchor = (t, e.mono)
        else:
            t = e.t + shift
        if prev is not None:
            t = max(t, prev)
        if e.mono is not None:    # the clocks' offset now (a record without a stamp, or
            last_mono = e.mono    # with a t of 0, never sets it)
            shift = t - e.t
        prev = t
        if isinstance(e, ev.AttemptStart):
            start_shift[e.attempt] = t - e.t
        if isinstance(e, ev.AttemptEnd):
            out.append(_moved(e, t, start_shift.get(e.attempt, t - e.t)))
        else:
            out.append(replace(e, t=t))
    now = None
    if mono is not None and anchor is not None and last_mono is not None and mono >= last_mono:
        now = anchor[0] + (mono - anchor[1])
    return out, now


def _moved(e: ev.AttemptEnd, t: float, by: float) -> ev.AttemptEnd:
    """``e`` at ``t``, its trainer times moved ``by`` seconds."""
    def mv(x: float | None) -> float | None:
        return None if x is None else x + by
    return replace(e, t=t, loop_t=mv(e.loop_t), first_step_t=mv(e.first_step_t),
                   last_step_t=mv(e.last_step_t))


def account(evs: Sequence[ev.Event], now: float | None = None,
            mono: float | None = None) -> Goodput:
    """Goodput and the time lost per cause of the newest run in ``evs`` (module doc), on
    the timeline of :func:`steady`; ``mono``: the reader's monotonic clock at ``now``."""
    raw = last_run(evs)
    lost = dict.fromkeys(CAUSES, 0.0)
    if not raw:
        return _done(0.0, 0.0, lost, live=True)
    evs, steady_now = steady(raw, mono)
    if steady_now is None and now is not None:
        steady_now = now + (evs[-1].t - raw[-1].t)
    t0 = evs[0].t
    final = next((e for e in evs if isinstance(e, ev.Final)), None)
    t1 = final.t if final else max(steady_now if steady_now is not None else 0.0, evs[-1].t)
    starts = {e.attempt: e for e in evs if isinstance(e, ev.AttemptStart)}
    ends = {e.attempt: e for e in evs if isinstance(e, ev.AttemptEnd)}
    done = {e.attempt for e in evs if isinstance(e, ev.Classified) and e.cls == "done"}
    order = sorted(starts)
    train = 0.0
    prev_end = t0
    for i, n in enumerate(order):
        s = starts[n]
        nxt = starts.get(order[i + 1]) if i + 1 < len(order) else None
        gap = max(0.0, s.t - prev_end)
        lost["startup" if i == 0 else "restart"] += gap
        end = ends.get(n)
        e_t = end.t if end else t1
        failed = n not in done and end is not None
        resumed_at = _from_step(nxt, ends.get(nxt.attempt) if nxt else None, evs) if nxt else None
        seen = [w.t for w in evs if isinstance(w, ev.Watchdog) and w.attempt == n]
        part = _attempt(s, end, e_t, failed, resumed_at,
                        [c for c in evs if isinstance(c, ev.Checkpoint) and c.attempt == n],
                        seen[0] if seen else None)
        train += part.pop("train")
        for k, v in part.items():
            lost[k] += v
        prev_end = e_t
    lost["other"] += max(0.0, t1 - prev_end)
    return _done(max(0.0, t1 - t0), train, lost, live=final is None)


def _done(wall: float, train: float, lost: dict[str, float], *, live: bool) -> Goodput:
    """The record; training never counts more than the wall time."""
    return Goodput(wall_s=round(wall, 3), train_s=round(min(wall, max(0.0, train)), 3),
                   lost_s={c: round(max(0.0, lost[c]), 3) for c in CAUSES}, live=live)


def _attempt(s: ev.AttemptStart, end: ev.AttemptEnd | None, e_t: float, failed: bool,
             resumed_at: int | None, ckpts: list[ev.Checkpoint],
             seen_t: float | None) -> dict[str, float]:
    """One attempt's seconds: train and each cause (``failed``: a next attempt or the end
    follows a failure; ``resumed_at``: the step the next attempt resumed from; ``seen_t``:
    when the watchdog first saw something wrong in it)."""
    out = {"train": 0.0, "startup": 0.0, "compile": 0.0, "detection": 0.0, "redone": 0.0,
           "other": 0.0}
    span = max(0.0, e_t - s.t)
    loop_t = _within(end.loop_t, s.t, e_t) if end is not None else None
    first, last = _steps(end, ckpts)
    if first is not None and last is not None:   # reported times lie within the attempt
        first = (first[0], _within(first[1], s.t, e_t))
        last_t = _within(last[1], s.t, e_t)
        last = (last[0], last_t if first[1] is None or last_t is None else max(first[1], last_t))
    if first is None or last is None:
        trained = bool(end and end.reached_train) or bool(ckpts)
        if end is not None and loop_t is not None and not trained:
            out["startup"] = max(0.0, min(loop_t, e_t) - s.t - (end.warmup_s or 0.0))
            out["compile"] = span - out["startup"]
        elif failed and trained and resumed_at is not None:
            out["redone"] = span
        else:
            out["startup" if not trained else "train"] = span
        return out
    (f_step, f_t), (l_step, l_t) = first, last
    from_step = end.from_step if end is not None and end.from_step is not None else _step_of(s.resume)
    sps = (l_t - f_t) / (l_step - f_step) if l_step > f_step and l_t > f_t else None
    head_steps = max(0, f_step - (from_step or 0))
    head = max(0.0, f_t - (loop_t if loop_t is not None else s.t))
    head_train = min(head, head_steps * sps) if sps is not None else 0.0
    warm = (end.warmup_s or 0.0) if end is not None else 0.0
    if loop_t is not None:
        out["startup"] = max(0.0, loop_t - s.t - warm)
        out["compile"] = warm + head - head_train
    else:   # estimated from checkpoints: all before the first one's steps is start-up
        out["startup"] = head - head_train
    train = head_train + max(0.0, l_t - f_t)
    # a failed attempt trained on after its last step report until the failure showed (the
    # watchdog's first event), then the failure took the rest of it to be acted on
    fail_t = l_t
    if failed and seen_t is not None and l_t < seen_t <= e_t:
        fail_t = seen_t
    after = fail_t - l_t
    tail = max(0.0, e_t - fail_t)
    out["detection" if failed else "other"] = tail
    train += after
    if failed and resumed_at is not None:
        per = sps if sps is not None else train / max(1, l_step - (from_step or 0))
        past = max(0.0, (l_step - resumed_at) * per) + after
        out["redone"] = min(train, past)
        train -= out["redone"]
    out["train"] = train
    return out


def _within(x: float | None, lo: float, hi: float) -> float | None:
    return None if x is None else min(max(x, lo), max(lo, hi))


def _steps(end: ev.AttemptEnd | None, ckpts: list[ev.Checkpoint]):
    """((first step, its t), (last step, its t)) the attempt reported: its step reports
    (``attempt_end``'s fields), or else its checkpoints; (None, None) without either."""
    if end is not None and end.first_step is not None and end.first_step_t is not None \
            and end.last_step is not None and end.last_step_t is not None:
        return (end.first_step, end.first_step_t), (end.last_step, end.last_step_t)
    pts = [(c.step, c.t) for c in ckpts if c.step is not None]
    if not pts:
        return None, None
    return min(pts), max(pts)


def _from_step(start: ev.AttemptStart, end: ev.AttemptEnd | None,
               evs: Sequence[ev.Event]) -> int:
    """The step an attempt started from: its own report, its ``--resume`` checkpoint's name,
    or the newest checkpoint recorded before it started (0: from scratch)."""
    if end is not None and end.from_step is not None:
        return end.from_step
    got = _step_of(start.resume)
    if got is not None:
        return got
    if start.resume is None:
        return 0
    before = [c.step for c in evs if isinstance(c, ev.Checkpoint) and c.t <= start.t
              and c.step is not None]
    return max(before, default=0)


def _step_of(resume: str | None) -> int | None:
    m = re.search(r"step_(\d+)/?$", resume or "")
    return int(m.group(1)) if m else None


class AttemptClock:
    """What an attempt's ``attempt_end`` says about its time, gathered from the trainer's
    markers as the supervisor reads them (``feed`` each parsed marker; ``fields()`` for the
    event). A marker without a number ``t`` (your own trainer's step line) counts at
    ``now``, the epoch seconds it was read."""

    def __init__(self) -> None:
        self.loop_t: float | None = None
        self.warmup_s: float | None = None
        self.from_step: int | None = None
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def feed(self, m: TrainerMarker, now: float, wall: float | None = None) -> None:
        """``now``: when the marker was read, on the attempt's steady clock; ``wall``: the
        epoch seconds then. A marker's own ``t`` counts as its age by the wall clock
        before ``now`` (a step of the wall clock never moves it out of the attempt's
        timeline); without ``wall`` the marker's ``t`` is taken as it is."""
        if m.t is None:
            t = now
        elif wall is None:
            t = m.t
        else:
            t = now - max(0.0, wall - m.t)
        if isinstance(m, StartupMarker):
            self.loop_t = t
            self.warmup_s = m.phase_s("warm-up")
            if m.step is not None:
                self.from_step = m.step
        elif isinstance(m, StepMarker) and m.step is not None:
            if self.first is None:
                self.first = (m.step, t)
            self.last = (m.step, t)

    def fields(self) -> dict[str, Any]:
        f, la = self.first, self.last
        return {"loop_t": _r(self.loop_t), "warmup_s": _r(self.warmup_s),
                "from_step": self.from_step,
                "first_step": f[0] if f else None, "first_step_t": _r(f[1]) if f else None,
                "last_step": la[0] if la else None, "last_step_t": _r(la[1]) if la else None}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
