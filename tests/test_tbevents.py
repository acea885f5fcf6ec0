"""trainer.telemetry.tbevents: event files written by hand, read back by TensorBoard's own reader."""

from __future__ import annotations

import glob
import os
import struct

import pytest

from trainer.telemetry import tbevents

ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _load(logdir: str):
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def _scalars(acc, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tag, whether TensorBoard kept it as a scalar or a tensor."""
    tags = acc.Tags()
    if tag in tags.get("scalars", []):
        return [(e.step, e.value) for e in acc.Scalars(tag)]
    from tensorboard.util import tensor_util

    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_crc32c_known_answers():
    assert tbevents.crc32c(b"123456789") == 0xE3069283
    assert tbevents.crc32c(b"") == 0
    assert tbevents.crc32c(bytes(32)) == 0x8A9136AA


def test_frame_layout():
    data = b"hello"
    rec = tbevents.frame(data)
    assert struct.unpack("<Q", rec[:8])[0] == 5
    assert struct.unpack("<I", rec[8:12])[0] == tbevents.masked_crc32c(rec[:8])
    assert rec[12:17] == data
    assert struct.unpack("<I", rec[17:])[0] == tbevents.masked_crc32c(data)


def test_scalars_takes_numbers_and_lists():
    rec = {"step": 3, "loss": 1.5, "acc": None, "phase": "train", "ok": True, "attempt": 2,
           "acc_per_pos": [0.5, 0.25], "nan": float("nan")}
    assert tbevents.scalars(rec) == [("loss", 1.5), ("attempt", 2.0),
                                     ("acc_per_pos/0", 0.5), ("acc_per_pos/1", 0.25)]


def test_written_events_read_back_by_tensorboard(tmp_path):
    w = tbevents.ScalarWriter(str(tmp_path))
    recs = [{"step": s, "loss": 2.0 / s, "acc": 0.1 * s, "tau": 1.0 + s / 10, "lr": 1e-3,
             "tokens_per_s": 1000.0 + s, "phase": "train", "acc_per_pos": [0.5, 0.25 * s],
             "brand_new_metric": 7 * s} for s in (1, 2, 5, 300000)]
    for r in recs:
        w.write(r["step"], r)
    w.close()
    files = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    assert len(files) == 1 and os.path.basename(files[0]).startswith("events.out.tfevents.")
    acc = _load(str(tmp_path))
    assert acc.file_version == 2.0  # parsed from "brain.Event:2"
    for tag in ("loss", "acc", "tau", "lr", "tokens_per_s", "acc_per_pos/0", "acc_per_pos/1",
                "brand_new_metric"):
        got = _scalars(acc, tag)
        assert [s for s, _ in got] == [1, 2, 5, 300000], tag
    assert [v for _, v in _scalars(acc, "loss")] == pytest.approx([2.0, 1.0, 0.4, 2.0 / 300000],
                                                                   rel=1e-6)
    assert [v for _, v in _scalars(acc, "acc_per_pos/1")] == pytest.approx(
        [0.25, 0.5, 1.25, 75000.0], rel=1e-6)
    assert "phase" not in str(acc.Tags())


def test_training_run_writes_a_readable_event_file(tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841
    from tests.helpers.trainer import make_synth, make_target, run_trainer, tiny_overrides

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "data.bin"))
    run_dir = tmp_path / "run"
    p = run_trainer(["train", *tiny_overrides(target, data, str(run_dir), **{"train.max_steps": 4})])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(glob.glob(str(run_dir / "events.out.tfevents.*"))) == 1
    acc = _load(str(run_dir))
    for tag in ("loss", "acc", "tau", "lr", "tokens_per_s", "acc_per_pos/0"):
        assert [s for s, _ in _scalars(acc, tag)] == [1, 2, 3, 4], tag
    import json

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [v for _, v in _scalars(acc, "loss")] == pytest.approx([r["loss"] for r in lines],
                                                                   rel=1e-6)
