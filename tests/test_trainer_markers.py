"""The trainer's ``@dfo`` markers as types (dfo_contract.trainer_markers): each round-trips
through its line, reads leniently, and what the real trainer prints parses into them."""

from __future__ import annotations

import json
import math

from dfo_contract.markers import PREFIX
from dfo_contract.trainer_markers import (MARKER_VERSION, BestMarker, CheckpointMarker, DoneMarker,
                                          EvalMarker, HeartbeatMarker, OtherMarker, PhaseMarker,
                                          StartupMarker, StepMarker, from_record, read_marker)

EXAMPLES = [
    PhaseMarker(t=1.0, phase="warmup"),
    HeartbeatMarker(t=2.0, phase="train", step=3),
    StepMarker(t=3.0, step=4, loss=2.5, acc=0.1, tau=1.4, lr=6e-4, tokens_per_s=1234.5,
               samples_per_s=3.1, peak_mem_bytes=10, phase="train", attempt=2,
               acc_per_pos=(0.5, 0.25)),
    CheckpointMarker(t=4.0, step=20, path="/c/run/step_20"),
    EvalMarker(t=5.0, step=20, accept_len=3.1, best_accept_len=3.2, eval_blocks=64, eval_s=2.0,
               phase="eval", attempt=1),
    BestMarker(t=6.0, step=20, accept_len=3.1),
    StartupMarker(t=7.0, step=0, total_s=21.4, phases=(("spawn", 4.1), ("warm-up", 7.4))),
    DoneMarker(t=8.0, step=40),
]


def test_each_marker_round_trips_through_its_line():
    for m in EXAMPLES:
        line = m.line()
        assert line.startswith(PREFIX) and line.endswith("\n") and line.count("\n") == 1
        rec = json.loads(line[len(PREFIX):])
        assert rec["kind"] == m.KIND and rec["v"] == MARKER_VERSION
        assert read_marker(line) == m, m
    assert EXAMPLES[6].phase_s("warm-up") == 7.4 and EXAMPLES[6].phase_s("resume") == 0.0


def test_markers_read_leniently_and_never_raise():
    # wrong types read as None; an unknown kind is an OtherMarker; junk is no marker
    m = from_record({"kind": "step", "step": "12", "loss": True, "tokens_per_s": 5,
                     "acc_per_pos": [0.5, "x"]})
    assert (m.step, m.loss, m.tokens_per_s, m.acc_per_pos) == (None, None, 5.0, (0.5,))
    other = read_marker('@dfo {"kind": "bench", "x": 1}')
    assert isinstance(other, OtherMarker) and other.kind == "bench" and other.record["x"] == 1
    assert isinstance(from_record({"kind": 3}), OtherMarker)
    for line in ("step 3", "@dfo not json", "@dfo [1, 2]", ""):
        assert read_marker(line) is None
    # a NaN loss read from another trainer is news; the bundled trainer prints it as null
    nan = from_record({"kind": "step", "step": 1, "loss": float("nan")})
    assert nan.loss_is_nan and math.isnan(nan.loss)
    assert '"loss": null' in StepMarker(step=1, loss=float("nan")).line()


def test_the_trainer_prints_typed_markers(tmp_path, capsys):
    """The real Emitter and Heartbeat: every line they print reads back as its type."""
    from trainer.telemetry.metrics import Emitter

    em = Emitter(str(tmp_path), attempt=2)
    em.set_phase("train")
    em.step({"step": 1, "loss": 2.0, "acc": 0.5, "tau": 1.5, "lr": 1e-3, "tokens_per_s": 10.0,
             "samples_per_s": 1.0, "peak_mem_bytes": 5, "phase": "train", "attempt": 2,
             "acc_per_pos": [0.5]})
    em.eval({"step": 1, "accept_len": 2.0, "eval_blocks": 4, "eval_s": 0.1, "best_accept_len": 2.0})
    em.emit(DoneMarker(step=1))
    got = [read_marker(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("@dfo")]
    assert [type(m).__name__ for m in got] == ["PhaseMarker", "StepMarker", "EvalMarker",
                                               "DoneMarker"]
    assert got[1].loss == 2.0 and got[1].acc_per_pos == (0.5,) and got[1].attempt == 2
    assert got[2].accept_len == 2.0 and got[2].attempt == 2 and got[3].step == 1
