"""Goodput and the time lost per cause (orchestrator.common.goodput), on recorded events (three
real runs of tests/fixtures/events/recorded.jsonl, written before attempts carried their
timing fields) and on a run whose attempts carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfo_contract import events as ev
from dfo_contract.goodput import CAUSES, seconds_text
from orchestrator.common.goodput import AttemptClock, account, last_run

FIX = Path(__file__).parent / "fixtures" / "events" / "recorded.jsonl"


def _runs() -> list[list[ev.Event]]:
    runs: list[list[ev.Event]] = []
    for e in ev.read_events(FIX.read_text()):
        if isinstance(e, ev.SupervisorStart) and not e.resumed:
            runs.append([])
        runs[-1].append(e)
    return runs


def _sums(g) -> None:
    assert g.train_s + g.lost_total_s == pytest.approx(g.wall_s, abs=0.01)
    assert list(g.lost_s) == list(CAUSES)
    assert all(s >= 0 for s in g.lost_s.values())


def test_recorded_fx_recovery_without_timing_fields():
    fx = _runs()[0]
    g = account(fx)
    _sums(g)
    assert g.wall_s == pytest.approx(fx[-1].t - fx[0].t, abs=0.01) and not g.live
    # attempt 1 trained and failed without a checkpoint: all of it is trained again
    assert g.lost("redone") == pytest.approx(61.3, abs=0.1)
    # attempt 1's end to attempt 2's start: classification, backoff, cache restore
    assert g.lost("restart") == pytest.approx(1.05, abs=0.01)
    # attempt 2: the time before its first checkpoint less its steps is start-up
    assert 45 < g.lost("startup") < 50
    assert g.train_s == pytest.approx(60 * (6.467 / 50), rel=0.02)   # 60 steps at the measured pace
    assert g.goodput == pytest.approx(g.train_s / g.wall_s, abs=1e-4)


def test_recorded_runs_each_add_up_and_the_file_reads_as_its_newest_run():
    runs = _runs()
    for r in runs:
        _sums(account(r))
    whole = ev.read_events(FIX.read_text())
    assert last_run(whole) == runs[-1]
    assert account(whole) == account(runs[-1])
    hang = account(runs[1])     # a start-up hang, then a run_first warm-up and a clean run
    assert hang.lost("startup") == pytest.approx(67.84, abs=0.01) and hang.lost("redone") == 0


def _timed_run() -> list[ev.Event]:
    """Attempt 1 trains from step 0, reports steps 10..30 (1 s a step after a 20 s compile),
    checkpoints at 20, fails 4 s after its step-30 report; attempt 2 resumes step 20 after
    a 2 s backoff, warms up 6 s and trains to 60."""
    A = ev.AttemptStart
    return [
        ev.SupervisorStart(t=1000.0, pid=1, mode="setsid", resumed=False),
        A(t=1001.0, attempt=1, resume=None, overrides={}, argv=[], pid=2, log="attempt-1.log"),
        ev.Checkpoint(t=1050.0, attempt=1, step=20, path="/c/step_20"),
        ev.AttemptEnd(t=1064.0, attempt=1, exit_code=5, signal=None, duration_s=63.0,
                      reached_train=True, loop_t=1011.0, warmup_s=0.0, from_step=0,
                      first_step=10, first_step_t=1040.0, last_step=30, last_step_t=1060.0),
        ev.Classified(t=1064.0, attempt=1, cls="fx_trace_race", reason="x", evidence=[], also=[]),
        ev.Restart(t=1064.0, attempt=2, delay_s=2.0, reason="r"),
        A(t=1066.0, attempt=2, resume="/c/step_20", overrides={}, argv=[], pid=3,
          log="attempt-2.log"),
        ev.AttemptEnd(t=1120.0, attempt=2, exit_code=0, signal=None, duration_s=54.0,
                      reached_train=True, loop_t=1080.0, warmup_s=6.0, from_step=20,
                      first_step=30, first_step_t=1090.0, last_step=60, last_step_t=1119.0),
        ev.Classified(t=1120.0, attempt=2, cls="done", reason="d", evidence=[], also=[]),
        ev.Final(t=1120.5, status="done", reason="d", last_checkpoint=None),
    ]


def test_timed_attempts_split_every_cause():
    g = account(_timed_run())
    _sums(g)
    assert g.wall_s == 120.5
    # start-up: 1 s before attempt 1, 10 s to its loop; attempt 2: 14 s to its loop less 6 s warm-up
    assert g.lost("startup") == pytest.approx(1 + 10 + 8)
    # compile: attempt 1's 29 s to its first report less 10 steps at 1 s; attempt 2's warm-up
    # and its 10 s to its first report less 10 steps at 0.967 s
    assert g.lost("compile") == pytest.approx(19 + 6 + (10 - 10 * 29 / 30), abs=0.01)
    assert g.lost("detection") == 4.0 and g.lost("restart") == 2.0
    assert g.lost("redone") == pytest.approx(10.0)      # steps 21..30 trained twice
    assert g.lost("other") == pytest.approx(1.5)        # attempt 2's last save, the final
    assert g.train_s == pytest.approx(20 + 29 + 10 * 29 / 30, abs=0.01)
    assert g.to_json()["goodput"] == round(g.train_s / 120.5, 4)
    assert g.summary().startswith("goodput 49% (training 58.7 s of 2m00s)") and "redone 10.0 s" in g.summary()


def test_a_live_run_counts_to_now_and_an_empty_one_is_zero():
    live = _timed_run()[:4]
    g = account(live, now=1070.0)
    assert g.live and g.wall_s == 70.0
    _sums(g)
    assert account([]).goodput is None and account([]).wall_s == 0


def test_the_attempt_clock_reads_the_trainer_markers():
    from dfo_contract.trainer_markers import from_record

    c = AttemptClock()
    for rec, now in (({"kind": "phase", "phase": "compile", "t": 5.0}, 99.0),
                     ({"kind": "startup", "step": 20, "total_s": 9.0,
                       "phases": {"warm-up": 4.0}, "t": 10.0}, 99.0),
                     ({"kind": "step", "step": 30, "t": 20.0}, 99.0),
                     ({"kind": "step", "step": 40}, 31.0)):  # your own trainer's line: read time
        c.feed(from_record(rec), now)
    f = c.fields()
    assert f == {"loop_t": 10.0, "warmup_s": 4.0, "from_step": 20, "first_step": 30,
                 "first_step_t": 20.0, "last_step": 40, "last_step_t": 31.0}
    end = ev.AttemptEnd(attempt=1, exit_code=0, signal=None, duration_s=1.0, **f)
    assert ev.decode(ev.encode_line(end)) == end      # optional fields of version 1


def test_seconds_text():
    assert seconds_text(8.44) == "8.4 s" and seconds_text(127) == "2m07s"


def test_training_after_the_last_report_until_the_failure_showed_is_redone():
    evs = _timed_run()
    evs.insert(3, ev.Watchdog(t=1062.0, attempt=1, reason="fx_trace_race seen in the output"))
    g = account(evs)
    _sums(g)
    assert g.lost("detection") == 2.0 and g.lost("redone") == pytest.approx(12.0)
    assert g.train_s == pytest.approx(account(_timed_run()).train_s)


def test_a_line_that_is_not_utf8_is_skipped_and_the_run_keeps_its_goodput(tmp_path):
    """status's host query (``run_info``) and the supervisor's final goodput read
    events.jsonl through ``read_events_file``: one damaged line hides nothing else."""
    import json

    from dfo_contract.fsio import atomic_write_json
    from dfo_contract import runstate as rs
    from orchestrator.supervisor.query import run_info

    lines = FIX.read_bytes().splitlines(keepends=True)
    first = [ln for ln in lines if ln.strip()][: len(_runs()[0])]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rs.EVENTS_FILE).write_bytes(b"".join(first[:3]) + b'{"kind": "\xff\xfe"}\n'
                                           + b"\xc3(\n" + b"".join(first[3:]))
    st = rs.new_state("run", "x", now=1.0)
    st["status"] = "done"
    atomic_write_json(run_dir / rs.STATE_FILE, st)
    want = account(_runs()[0])
    assert account(ev.read_events_file(str(run_dir / rs.EVENTS_FILE))) == want
    info = run_info(str(run_dir))
    assert info.time is not None and info.time.goodput == pytest.approx(want.goodput)
    json.dumps(info.to_json())


def _stepped(evs: list[ev.Event], at: float, by: float) -> list[ev.Event]:
    """``evs`` as a supervisor stamps them (``mono``: seconds since boot), their wall clock
    stepped ``by`` seconds from wall time ``at`` on; the trainer's times in an attempt_end
    are read against its attempt's start (the watch's clock), so they move with it."""
    from dataclasses import replace

    start: dict[int, float] = {}
    out = []
    for e in evs:
        d = by if e.t >= at else 0.0
        if isinstance(e, ev.AttemptStart):
            start[e.attempt] = d
        if isinstance(e, ev.AttemptEnd):
            s = start[e.attempt]
            e = replace(e, loop_t=e.loop_t + s, first_step_t=e.first_step_t + s,
                        last_step_t=e.last_step_t + s)
        out.append(replace(e, t=e.t + d, mono=e.t - 900.0))
    return out


@pytest.mark.parametrize("by", [-3600.0, -90.0, 7200.0])
def test_a_step_of_the_wall_clock_changes_no_figure(by):
    want = account(_timed_run())
    g = account(_stepped(_timed_run(), at=1064.0, by=by))
    assert g == want and g.goodput <= 1


def test_a_live_run_counts_to_the_readers_monotonic_now():
    evs = _stepped(_timed_run()[:-3], at=1064.0, by=-3600.0)   # attempt 2 still runs
    g = account(evs, now=1100.0 - 3600.0, mono=1100.0 - 900.0)
    assert g.live and g.wall_s == 100.0 and g.goodput <= 1


def test_records_without_a_monotonic_stamp_are_never_counted_above_their_wall_time():
    evs = _timed_run()
    evs[-1] = ev.Final(t=1030.0, status="done", reason="d", last_checkpoint=None)  # stepped back
    g = account(evs)
    assert g.train_s <= g.wall_s and g.goodput <= 1
