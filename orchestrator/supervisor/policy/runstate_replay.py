"""A run's state told by its events (pure): what ``state.json`` would say, rebuilt from
``events.jsonl`` when the state file is damaged (truncated, empty, not JSON, not a state).

The events carry the status, the reason, the supervisor's pid, each attempt's start, end
and class, the checkpoints and the final word; figures the supervisor keeps only in
``state.json`` (budgets, ladder positions, the throughput baseline) stay unknown.
"""

from __future__ import annotations

from typing import Iterable

from dfo_contract import events as ev
from dfo_contract.runstate import Attempt, CheckpointRef, RunState
from dfo_contract.state_records import copied


def state_from_events(run_id: str, evs: Iterable[ev.Event]) -> RunState:
    st = RunState(run_id=run_id)
    by_n: dict[int, Attempt] = {}
    for e in evs:
        if isinstance(e, ev.SupervisorStart):
            st.pid, st.mode, st.status = e.pid, e.mode, "running"
            st.started_at = st.started_at or e.t
        elif isinstance(e, ev.AttemptStart):
            a = Attempt(n=e.attempt, started_at=e.t, resume=e.resume, overrides=copied(e.overrides),
                        argv=list(e.argv), log=e.log, pid=e.pid)
            by_n[e.attempt] = a
            st.attempts.append(a)
            st.attempt, st.overrides, st.status = e.attempt, copied(e.overrides), "running"
        elif isinstance(e, ev.AttemptEnd) and e.attempt in by_n:
            a = by_n[e.attempt]
            a.ended_at, a.exit_code, a.signal = e.t, e.exit_code, e.signal
        elif isinstance(e, ev.Classified) and e.attempt in by_n:
            by_n[e.attempt].cls, by_n[e.attempt].reason = e.cls, e.reason
        elif isinstance(e, ev.Checkpoint):
            st.last_checkpoint = CheckpointRef(step=e.step, path=e.path)
            if e.step is not None:
                st.last_step = e.step
        elif isinstance(e, ev.Restart):
            st.status = "backoff"
        elif isinstance(e, ev.Stopping):
            st.status = "stopping"
        elif isinstance(e, ev.Final):
            st.status, st.reason, st.ended_at = e.status, e.reason, e.t
            st.last_checkpoint = e.last_checkpoint or st.last_checkpoint
        st.updated_at = e.t
        st.last_event = e.describe()
    return st
