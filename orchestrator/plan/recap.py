"""What a finished run went through, for a person: ``recap(events)`` -> :class:`Recap`, and
its lines (``Recap.lines()``). ``dfo demo`` ends with it. Pure: one run's events only.

It names the first failure the supervisor classified (its class and why), the fallback it
applied for it, the checkpoint the next attempt resumed from, the time lost
(``common.goodput``), and the measured acceptance length at the run's first and last
evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dfo_contract import events as ev
from dfo_contract.goodput import Goodput, seconds_text

from ..common.goodput import account, last_run

VERSION = 1


@dataclass(frozen=True)
class Recap:
    status: str | None                     # done | failed | stopped (None: not ended)
    reason: str | None
    attempts: int
    failure_cls: str | None                # the first failure's class
    failure_reason: str | None
    failure_line: str | None               # the first line of its evidence (the error)
    fallback: str | None                   # "compile_gate (compile.gate=true)"
    resumed_from: str | None               # the checkpoint the next attempt resumed from
    accept_first: tuple[int, float] | None   # (step, measured acceptance length)
    accept_last: tuple[int, float] | None
    time: Goodput
    version: int = VERSION

    def lines(self) -> list[str]:
        """Short lines (each well under 80 columns but for paths) saying what happened."""
        out = [f"run {self.status or 'not ended'} after {self.attempts} attempt(s)"
               + (f": {self.reason}" if self.reason else "")]
        if self.failure_cls:
            out.append(f"failure: {self.failure_cls} ({self.failure_reason})")
            if self.failure_line:
                out.append(f"  seen: {self.failure_line}")
            out.append(f"fallback: {self.fallback or 'none (the same config again)'}")
            out.append(f"resumed from: {self.resumed_from or 'the start (no checkpoint yet)'}")
        else:
            out.append("failure: none")
        g = self.time
        lost = ", ".join(f"{c} {seconds_text(s)}" for c, s in g.lost_s.items() if s >= 0.05)
        out.append(f"time: {seconds_text(g.wall_s)} in all, {seconds_text(g.train_s)} training"
                   + (f" (goodput {g.goodput:.0%})" if g.goodput is not None else ""))
        out.append(f"time lost: {seconds_text(g.lost_total_s)}" + (f" ({lost})" if lost else ""))
        a, b = self.accept_first, self.accept_last
        if a and b and a[0] != b[0]:
            out.append(f"acceptance length: {a[1]:.2f} at step {a[0]} -> {b[1]:.2f} at step {b[0]}")
        elif b:
            out.append(f"acceptance length: {b[1]:.2f} at step {b[0]}")
        return out


def recap(evs: Sequence[ev.Event], now: float | None = None) -> Recap:
    """The newest run of ``evs`` summed up (module doc)."""
    evs = last_run(evs)
    final = next((e for e in evs if isinstance(e, ev.Final)), None)
    starts = [e for e in evs if isinstance(e, ev.AttemptStart)]
    failed = next((e for e in evs if isinstance(e, ev.Classified) and e.cls != "done"), None)
    fb = rs = None
    if failed is not None:
        f = next((e for e in evs if isinstance(e, ev.Fallback) and e.attempt == failed.attempt),
                 None)
        if f is not None:
            changed = ", ".join(f"{k}={_val(v)}" for k, v in (f.changed or {}).items())
            fb = (f.step or "same config") + (f" ({changed})" if changed else "")
        nxt = next((e for e in starts if e.attempt == failed.attempt + 1), None)
        rs = nxt.resume if nxt is not None else None
    evals = [(e.step, e.accept_len) for e in evs if isinstance(e, ev.Eval)
             and e.step is not None and e.accept_len is not None]
    return Recap(status=final.status if final else None, reason=final.reason if final else None,
                 attempts=len(starts), failure_cls=failed.cls if failed else None,
                 failure_reason=failed.reason if failed else None,
                 failure_line=_first_line(failed) if failed else None, fallback=fb,
                 resumed_from=rs, accept_first=evals[0] if evals else None,
                 accept_last=evals[-1] if evals else None, time=account(evs, now=now))


def _first_line(c: ev.Classified, width: int = 160) -> str | None:
    for e in c.evidence:
        text = e.text.strip()
        if text:
            return text if len(text) <= width else text[:width - 1] + "…"
    return None


def _val(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)
