"""metrics.jsonl lines and ``@dfo`` marker lines, byte for byte: the records below write the
lines stored in ``tests/fixtures/trainer_records/`` (``metrics.jsonl``, ``markers.log``), and
each stored line (those, and lines from other writers: mistyped fields, torn records, other
versions) reads to the stored record and writes back to the stored line
(``*_read.jsonl``: ``line``, the record's ``repr`` or null, the line it writes or null).
Both formats go through the records' codec (``dfo_contract.codec``), which writes their
non-finite floats as null, nested ones too.

``PYTHONPATH=. python tests/test_trainer_record_bytes.py`` rewrites the fixtures from the code."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from dfo_contract.fsio import json_object, jsonl_line
from dfo_contract.metrics_record import MetricsRecord
from dfo_contract.trainer_markers import (BestMarker, CheckpointMarker, DoneMarker, EvalMarker,
                                          HeartbeatMarker, OtherMarker, PhaseMarker,
                                          StartupMarker, StepMarker, TrainerMarker, read_marker)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "trainer_records"
NAN, INF = float("nan"), float("inf")

#: what the trainer writes to metrics.jsonl: train and eval records with NaN, inf and None,
#: a train record that carries eval fields and the reverse, extras, acc_per_pos
METRICS = [
    MetricsRecord(step=10, attempt=1, loss=2.5, acc=0.25, tau=1.4, lr=6e-4, tokens_per_s=1234.5,
                  samples_per_s=3.1, peak_mem_bytes=123456789, acc_per_pos=(0.5, 0.25, 0.125)),
    MetricsRecord(step=11, attempt=2, loss=NAN, acc=None, tau=INF, lr=1e-3, tokens_per_s=-INF,
                  samples_per_s=None, peak_mem_bytes=None, acc_per_pos=(0.5, NAN, INF),
                  extra=(("grad_norm", 1.5), ("accept_x", NAN), ("skipped", None))),
    MetricsRecord(step=12, loss=1.0, tokens_per_s=10.0, accept_len=2.0, eval_blocks=4,
                  extra=(("tokens", 4096),)),
    MetricsRecord(step=40, phase="eval", attempt=1, accept_len=3.1, best_accept_len=3.2,
                  eval_blocks=64, eval_s=2.0),
    MetricsRecord(step=41, phase="eval", attempt=3, accept_len=NAN, best_accept_len=None,
                  eval_blocks=None, eval_s=INF, eval_target="fp8", loss=1.25, acc=NAN,
                  extra=(("accept_at_1", 0.9),)),
    MetricsRecord(step=42, phase="eval", accept_len=2.5, eval_target="served",
                  acc_per_pos=(0.75,)),
    MetricsRecord.of({"step": 7, "loss": 2, "acc": 0.5, "tau": 1, "lr": 0, "tokens_per_s": 99.5,
                      "samples_per_s": 1.5, "peak_mem_bytes": 0, "acc_per_pos": [1, 0.5],
                      "grad_norm": 0.25, "clip": 1}, attempt=1),
    MetricsRecord(step=8, phase="warmup", attempt=1),
    MetricsRecord(step=0, loss=-0.0, lr=1e-12, tokens_per_s=1e20),
]

#: metrics.jsonl lines of other writers: mistyped fields, no integer step, another version
METRICS_OTHER = [
    '{"step": 3, "phase": 5, "attempt": "2", "loss": true, "acc": "x", "tau": 1, '
    '"peak_mem_bytes": 1.5, "eval_blocks": "4", "acc_per_pos": [0.5, "x", null, true, 1], '
    '"eval_target": 3, "n": 2, "s": "s", "b": true, "z": null, "l": [1]}',
    '{"v": 1, "step": 4, "phase": "eval", "accept_len": 3}',
    '{"step": 6, "acc_per_pos": "x", "lr": null}',
    '{"v": 1.0, "step": 9}',
    '{"v": 2, "step": 5}',
    '{"v": null, "step": 5}',
    '{"step": "5"}',
    '{"step": true}',
    '{"step": 5.0}',
    '{"loss": 1.0}',
]

#: what the trainer prints: each kind, with NaN, inf and None, and each metrics record's marker
MARKERS: list[TrainerMarker] = [
    PhaseMarker(t=1.0, phase="warmup"),
    HeartbeatMarker(t=2.5, phase="train", step=3),
    StepMarker(t=3.0, step=4, loss=2.5, acc=0.1, tau=1.4, lr=6e-4, tokens_per_s=1234.5,
               samples_per_s=3.1, peak_mem_bytes=10, phase="train", attempt=2,
               acc_per_pos=(0.5, 0.25)),
    StepMarker(t=3.5, step=5, loss=NAN, acc=None, tau=INF, lr=-INF, tokens_per_s=None,
               samples_per_s=None, peak_mem_bytes=None, phase="train", attempt=None),
    StepMarker(t=NAN, step=6, phase=None),
    CheckpointMarker(t=4.0, step=20, path="/c/run/step_20"),
    CheckpointMarker(t=4.1),
    EvalMarker(t=5.0, step=20, accept_len=3.1, best_accept_len=3.2, eval_blocks=64, eval_s=2.0,
               phase="eval", attempt=1),
    EvalMarker(t=5.5, step=21, accept_len=NAN, eval_s=INF, eval_target="fp8", phase=None),
    BestMarker(t=6.0, step=20, accept_len=3.1),
    BestMarker(t=6.5, step=21, accept_len=INF),
    StartupMarker(t=7.0, step=0, total_s=21.4, phases=(("spawn", 4.1), ("warm-up", 7.4))),
    StartupMarker(t=7.5, total_s=NAN),
    DoneMarker(t=8.0, step=40),
    OtherMarker(t=9.0, kind="bench", record={"kind": "bench", "x": 1.5, "y": NAN, "t": 9.0}),
    *(replace(r.marker(), t=10.0 + i) for i, r in enumerate(METRICS)
      if all(math.isfinite(a) for a in r.acc_per_pos)),
]

#: marker lines of other trainers: mistyped fields, missing ones, kinds not listed
MARKERS_OTHER = [
    '@dfo {"kind": "step", "step": "12", "loss": true, "tokens_per_s": 5, '
    '"acc_per_pos": [0.5, "x", null, 2], "phase": 3, "attempt": 1.0, "t": "now"}',
    '@dfo {"kind": "step", "v": 7, "step": 2, "loss": NaN, "acc": Infinity, "t": 1}',
    '@dfo {"kind": "eval", "step": 3, "t": 2}',
    '@dfo {"kind": "startup", "phases": {"spawn": 1, "x": "y", "z": null, "b": true}, '
    '"total_s": 2, "t": 5}',
    '@dfo {"kind": "startup", "phases": [["spawn", 1.0]], "t": 5}',
    '@dfo {"kind": "heartbeat", "phase": "compile", "step": 0, "t": 6}',
    '@dfo {"kind": "done", "step": false, "t": 2}',
    '@dfo {"kind": "checkpoint", "step": 5, "path": 7, "t": 3}',
    '@dfo {"kind": "best", "step": 1, "accept_len": null, "t": 3}',
    '@dfo {"kind": 3, "t": 1}',
    '@dfo {"kind": "bench", "x": 1, "t": "x"}',
]


def _metrics_case(line: str) -> dict:
    rec = MetricsRecord.from_json(json_object(line) or {})
    return {"line": line, "read": None if rec is None else repr(rec),
            "written": None if rec is None else jsonl_line(rec.to_json()).decode()[:-1]}


def _marker_case(line: str) -> dict:
    m = read_marker(line)
    return {"line": line, "read": None if m is None else repr(m),
            "written": None if m is None or m.t is None else m.line()[:-1]}


def _lines(path: Path) -> list[str]:
    return path.read_bytes().decode().splitlines()


def _cases(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in _lines(path)]


def write_fixtures() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    metrics = b"".join(jsonl_line(r.to_json()) for r in METRICS)
    (FIXTURES / "metrics.jsonl").write_bytes(metrics)
    markers = "".join(m.line() for m in MARKERS)
    (FIXTURES / "markers.log").write_text(markers)
    for name, case, lines in (
            ("metrics_read.jsonl", _metrics_case, [*metrics.decode().splitlines(), *METRICS_OTHER]),
            ("markers_read.jsonl", _marker_case, [*markers.splitlines(), *MARKERS_OTHER])):
        (FIXTURES / name).write_text("".join(json.dumps(case(ln)) + "\n" for ln in lines))


def test_metrics_records_write_the_stored_lines():
    stored = (FIXTURES / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert len(stored) == len(METRICS)
    for rec, line in zip(METRICS, stored, strict=True):
        assert jsonl_line(rec.to_json()) == line, rec


def test_metrics_lines_read_and_write_back_as_stored():
    cases = _cases(FIXTURES / "metrics_read.jsonl")
    assert [c["line"] for c in cases[:len(METRICS)]] == _lines(FIXTURES / "metrics.jsonl")
    for c in cases:
        assert _metrics_case(c["line"]) == c, c["line"]


def test_markers_write_the_stored_lines():
    stored = _lines(FIXTURES / "markers.log")
    assert len(stored) == len(MARKERS)
    for m, line in zip(MARKERS, stored, strict=True):
        assert m.line() == line + "\n", m


def test_marker_lines_read_and_write_back_as_stored():
    cases = _cases(FIXTURES / "markers_read.jsonl")
    assert [c["line"] for c in cases[:len(MARKERS)]] == _lines(FIXTURES / "markers.log")
    for c in cases:
        assert _marker_case(c["line"]) == c, c["line"]


def test_nested_non_finite_floats_are_written_as_null():
    line = StepMarker(t=1.0, step=1, loss=NAN, acc_per_pos=(0.5, NAN, -INF)).line()
    assert '"loss": null' in line and '"acc_per_pos": [0.5, null, null]' in line
    line = StartupMarker(t=1.0, step=0, total_s=INF, phases=(("spawn", 1.5), ("data", NAN))).line()
    assert '"total_s": null, "phases": {"spawn": 1.5, "data": null}' in line
    other = OtherMarker(t=1.0, kind="bench", record={"kind": "bench", "xs": [NAN], "o": {"y": INF}})
    assert other.line() == '@dfo {"kind": "bench", "xs": [null], "o": {"y": null}}\n'
    rec = MetricsRecord(step=1, acc_per_pos=(NAN,), extra=(("x", INF),)).to_json()
    assert rec["acc_per_pos"] == [None] and rec["x"] is None


def test_the_codec_strings_read_as_floats_and_a_value_is_finite():
    m = read_marker('@dfo {"kind": "step", "step": 1, "loss": "nan", "acc_per_pos": ["inf", 1]}')
    assert isinstance(m, StepMarker) and m.loss_is_nan and m.acc_per_pos == (INF, 1.0)
    r = MetricsRecord.from_json(json_object('{"step": 1, "loss": "nan", "tau": NaN, '
                                            '"acc_per_pos": [1, "inf"], "x": "-inf", "y": 2}'))
    assert r is not None and math.isnan(r.loss or 0.0) and math.isnan(r.tau or 0.0)
    assert r.acc_per_pos == (1.0, INF) and r.extra[1] == ("y", 2.0)
    assert r.value("loss") is None and r.value("x") is None and r.names() == ("y",)
    assert json.loads(jsonl_line(r.to_json()))["loss"] is None


if __name__ == "__main__":
    write_fixtures()
