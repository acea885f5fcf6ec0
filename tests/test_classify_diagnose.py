"""`dfo diagnose LOGFILE` on recorded real output, through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli import main

FIX = Path(__file__).parent / "fixtures" / "logs"


def run(capsys, *args):
    rc = main(["diagnose", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_diagnose_fx_error_json(capsys):
    rc, out, _ = run(capsys, "--json", "--exit-code", "5", str(FIX / "fx_trace_race_threads.log"))
    d = json.loads(out)
    assert rc == 0 and d["class"] == "fx_trace_race"
    assert any("Detected that you are using FX" in e["text"] for e in d["evidence"])
    assert d["fallback"]["class"] == "fx_trace_race" and d["fallback"]["step"]


def test_diagnose_human_output_names_class_evidence_and_fallback(capsys):
    rc, out, _ = run(capsys, str(FIX / "nccl_watchdog.log"))
    assert rc == 0
    assert out.startswith("nccl_timeout:")
    assert "Watchdog caught collective operation timeout" in out
    assert "restart with the same config" in out


def test_diagnose_missing_file_is_one_line_config_error(capsys, tmp_path):
    rc, _, err = run(capsys, str(tmp_path / "nope.log"))
    assert rc == 2 and err.count("\n") == 1 and "cannot read" in err
