"""bench/bench_trainer.py's figures from a run's metrics.jsonl records, and its arguments
(no trainer run: the script's --cpu-smoke does that)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_trainer", Path(__file__).resolve().parent.parent / "bench" / "bench_trainer.py")
bt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bt)


def _rec(step, sps, tps, peak, phase="train"):
    return {"step": step, "samples_per_s": sps, "tokens_per_s": tps, "peak_mem_bytes": peak,
            "phase": phase, "loss": 10.0 - step}


def test_steady_is_the_median_from_the_first_steady_step():
    recs = [_rec(s, 1.0 if s < 6 else float(s), 100.0 * s, 2**30 * s) for s in range(1, 11)]
    recs.append({"step": 10, "phase": "eval", "accept_len": 2.0})
    got = bt.steady(recs, 6)
    assert got["steps"] == [6, 10]
    assert got["samples_per_s"] == 8.0 and got["tokens_per_s"] == 800.0
    assert got["peak_mem_gib"] == 10.0 and got["last_loss"] == 0.0


def test_steady_of_a_run_cut_before_the_steady_steps_is_its_last_step():
    got = bt.steady([_rec(1, 3.0, 30.0, 2**31), _rec(2, 4.0, 40.0, 2**30)], 6)
    assert got["steps"] == [2, 2] and got["samples_per_s"] == 4.0 and got["peak_mem_gib"] == 2.0
    assert bt.steady([], 6)["samples_per_s"] is None


def test_table_gives_each_variant_against_the_first():
    rows = [{"label": "a", "samples_per_s": 8.0, "tokens_per_s": 100.0, "peak_mem_gib": 1.0,
             "to_first_step_s": 3.0, "startup": {"phases": {"warm-up": 2.0}}, "steps": [6, 9], "rc": 0},
            {"label": "b", "samples_per_s": 10.0, "tokens_per_s": None, "peak_mem_gib": None,
             "to_first_step_s": None, "startup": None, "steps": None, "rc": 5}]
    rows[0]["padding"] = {"pad_fraction": 0.15, "anchor_slots_used": 0.678}
    lines = bt.table(rows).splitlines()
    assert lines[2].startswith("| a | 8.00 | 1.00x | 100 | 0.150 | 0.678 | 1.0 | 3.0 | 2.0 |")
    assert lines[3].startswith("| b | 10.00 | 1.25x | - | - | - | - | - | - |") and \
        lines[3].endswith("| 5 |")


def test_an_unknown_preset_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        bt.main(["--variants", "dflash-fast", "--out", "/nonexistent/never"])
    assert "unknown 'dflash-fast'" in capsys.readouterr().err
