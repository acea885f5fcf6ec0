"""runstate + runfiles: atomic state.json, single-write event lines, schema checks."""

from __future__ import annotations

import json
import os
import threading

import pytest

from dfo_contract import events as ev
from dfo_contract import runstate as rs
from orchestrator.supervisor import runfiles


def test_write_json_atomic_never_leaves_a_torn_file(tmp_path):
    p = str(tmp_path / "state.json")
    runfiles.write_json_atomic(p, {"a": 1})
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            with open(p) as f:
                seen.append(json.load(f)["a"])  # raises on a torn file

    th = threading.Thread(target=reader)
    th.start()
    for i in range(300):
        runfiles.write_json_atomic(p, {"a": i, "pad": "x" * (i * 37 % 5000)})
    stop.set()
    th.join()
    assert seen and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_non_finite_values_stay_strict_json(tmp_path):
    p = str(tmp_path / "s.json")
    runfiles.write_json_atomic(p, {"loss": float("nan"), "x": [float("inf")]})
    assert json.loads(open(p).read()) == {"loss": "nan", "x": ["inf"]}


def test_events_are_whole_lines_from_concurrent_writers(tmp_path):
    p = str(tmp_path / "events.jsonl")

    def w(k):
        for i in range(200):
            runfiles.append_event(p, ev.Watchdog(attempt=k, reason="r" * (i % 300)))

    ths = [threading.Thread(target=w, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    lines = open(p).read().splitlines()
    assert len(lines) == 800 and len(ev.read_events(open(p).read())) == 800


def test_event_kinds_are_checked_and_described():
    with pytest.raises(ValueError):
        runfiles.append_event(os.devnull, ev.UnknownEvent(kind="nonsense"))
    e = ev.Fallback(attempt=1, cls="oom", step="halve_micro_batch",
                    changed={"train.micro_batch": 4}, overrides={}, restore_cache=False)
    assert e.describe() == "fallback for oom: halve_micro_batch (train.micro_batch=4)"
    for k, cls in ev.REGISTRY.items():   # every kind describes itself (full records:
        assert cls.describe is not ev.EventBase.describe, k   # tests/test_contract_events)


def test_state_schema():
    st = rs.new_state("r-1", "r", now=1.0)
    assert rs.validate_state(st) is st and st["status"] == "starting"
    with pytest.raises(ValueError):
        rs.validate_state({**st, "status": "weird"})
    with pytest.raises(ValueError):
        rs.validate_state({"version": 99})
    assert rs.attempt_of_log(rs.attempt_log_name(12)) == 12 and rs.attempt_of_log("x.log") is None
    assert rs.final_exit_code("failed") == 10 and rs.final_exit_code("done") == 0


def test_run_state_round_trips_state_json(tmp_path):
    st = rs.RunState.new("r-1", "r", now=1.0)
    st.attempts.append(rs.Attempt(n=1, started_at=2.0, argv=["python"], log="attempt-1.log"))
    st.overrides = {"compile.gate": True}
    st.extra["from_a_newer_supervisor"] = 7
    runfiles.write_state(str(tmp_path), st)
    raw = json.loads((tmp_path / rs.STATE_FILE).read_text())
    assert raw["attempts"][0]["log"] == "attempt-1.log" and raw["from_a_newer_supervisor"] == 7
    assert set(rs.new_state("r-1", "r", now=1.0)) <= set(raw)
    back = runfiles.read_state(str(tmp_path))
    assert back == st and back.to_json() == raw and back.current.n == 1
    # a state.json from before RunState (no baseline/startup keys) still reads
    old = {k: v for k, v in raw.items() if k not in ("baseline_overrides", "from_a_newer_supervisor")}
    assert rs.RunState.from_json(old).baseline_overrides is None
    with pytest.raises(ValueError):
        rs.RunState.from_json([1])
    with pytest.raises(ValueError):
        rs.RunState.from_json({"run_id": "x", "attempts": [{"n": 1}]})
