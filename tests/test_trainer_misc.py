"""Heartbeats, exit-code table, the tiny-target CLI, and the benchmark's CPU smoke run."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from tests.helpers.trainer import REPO, markers
from dfo_contract import exitcodes
from trainer.telemetry.metrics import Emitter, Heartbeat


def test_heartbeat_beats_while_working_and_not_while_idle():
    out = io.StringIO()
    em = Emitter(None, out=out)
    em.phase = "compile"
    with Heartbeat(em, every_s=0.3) as hb:
        # busy until 3 beats came (CPU time advances); a loaded CI box may lend this
        # process too little CPU in some 0.3 s windows: the bound only ends a broken run
        t_end = time.monotonic() + 120.0
        x = 0
        while time.monotonic() < t_end and hb.beats < 3:
            x += 1
        busy, w0 = hb.beats, hb.windows
        # idle (like a deadlock) for 5 windows, however long the box takes to judge them:
        # no beats (the window that was running when the work stopped may still beat)
        while hb.windows < w0 + 5 and time.monotonic() < t_end:
            time.sleep(0.05)
        idle = hb.beats - busy
    assert busy >= 3 and idle <= 1 and hb.windows >= w0 + 5
    ms = markers(out.getvalue())
    assert ms and all(m["kind"] == "heartbeat" and m["phase"] == "compile" for m in ms)


def test_emitter_writes_nan_as_null_and_step_fields(tmp_path):
    out = io.StringIO()
    em = Emitter(str(tmp_path), attempt=2, out=out)
    em.step({"step": 1, "loss": float("nan"), "acc": 0.5, "tau": 1.5, "lr": 1e-3, "tokens_per_s": 1.0,
             "samples_per_s": 1.0, "peak_mem_bytes": 0, "phase": "train", "attempt": 2})
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert rec["loss"] is None and rec["attempt"] == 2
    assert markers(out.getvalue())[0]["kind"] == "step"


def test_exit_code_table():
    assert exitcodes.TABLE[0].startswith("done") and set(exitcodes.TABLE) == {0, 2, 3, 4, 5, 6, 7}
    assert exitcodes.exit_code_for(exitcodes.DataError("x")) == 3
    assert exitcodes.exit_code_for(exitcodes.DiskFullError("x")) == 7
    assert exitcodes.exit_code_for(exitcodes.CheckpointError("x")) == 4
    assert exitcodes.exit_code_for(exitcodes.TrainerConfigError("x")) == 2
    assert exitcodes.exit_code_for(RuntimeError("x")) == 5


def test_tiny_target_cli(tmp_path):
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "trainer.model.target", "--out", str(out), "--layers", "3"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (64, 3, 128)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert not list(tmp_path.glob(".t.tmp-*"))


def test_bench_quick_cpu(tmp_path, capsys):
    from trainer.bench import drafter_step as bench

    assert bench.main(["--quick", "--cpu", "--variants", "flex-compiled,sdpa", "--json",
                       str(tmp_path / "b.json")]) == 0
    r = json.loads((tmp_path / "b.json").read_text())
    v = r["variants"]["sdpa"]
    assert v["drafter_step_ms"] > 0 and v["tokens_per_s"] > 0
    assert "skipped" in r["variants"]["flex-compiled"]
    assert r["flops"]["drafter_step"]["total"] > r["flops"]["drafter_step"]["lm_head"] > 0
    assert "| sdpa |" in capsys.readouterr().out


def test_bench_candidates_side_by_side_cpu(tmp_path, capsys):
    """--candidates: each measured on the same models after the variants (per-sample figures
    for a larger micro-batch), CUDA-only ones skipped on CPU, an unknown one refused."""
    from trainer.bench import drafter_step as bench

    out = tmp_path / "c.json"
    assert bench.main(["--quick", "--cpu", "--variants", "sdpa", "--candidate-variant", "sdpa",
                       "--candidates", "mb2,ce4096,mb2+ce4096,cudagraphs", "--iters", "1",
                       "--warmup", "1", "--json", str(out)]) == 0
    v = json.loads(out.read_text())["variants"]
    assert v["cand:mb2"]["micro_batch"] == 2 and v["cand:mb2"]["settings"] == {"micro_batch": 2}
    assert v["cand:mb2"]["ms_per_sample"] == pytest.approx(v["cand:mb2"]["drafter_step_ms"] / 2,
                                                           abs=2e-3)  # both rounded to 1e-3
    assert v["cand:mb2+ce4096"]["settings"] == {"micro_batch": 2, "ce_chunk": 4096}
    assert v["cand:ce4096"]["drafter_step_ms"] > 0 and v["sdpa"]["drafter_step_ms"] > 0
    assert "CUDA" in v["cand:cudagraphs"]["skipped"]
    assert "bench: cand:mb2:" in capsys.readouterr().out
    assert bench.main(["--quick", "--cpu", "--candidates", "nope"]) == 2


def test_bench_flop_formula_matches_prototype_figure():
    """The H200 shape: ~40.8 TFLOP per sample, so 103.7 ms/sample is ~40% MFU (the prototype)."""
    from trainer.bench.shapes import target_config
    from trainer.bench.flops import drafter_flops
    from trainer.model.drafter import DrafterSpec

    spec = DrafterSpec.from_target_config(target_config("qwen3-4b"), num_layers=5, num_taps=5)
    f = drafter_flops(spec, seq_len=3072, tq=8192, pairs=16 * 512 * (1536 + 16), label_rows=512 * 15)
    mfu = f["total"] / 0.1037 / 989e12
    assert 0.38 < mfu < 0.42


def test_target_forward_bench_compiled_layers_match_eager(tmp_path):
    """``trainer.compile.target.compile_layers`` (regional compile, tap hooks outside the
    graph) gives the eager features; the bench reports both side by side."""
    import json

    from trainer.bench import target_forward

    out = tmp_path / "t.json"
    assert target_forward.main(["--quick", "--cpu", "--variants", "eager,compiled",
                                "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r["variants"]) == {"eager", "compiled"}
    assert r["variants"]["compiled"]["rel_diff_vs_first"] < 1e-5
    assert r["variants"]["compiled"]["ms"] > 0 and "speedup_vs_first" in r["variants"]["compiled"]
    assert target_forward.main(["--quick", "--cpu", "--variants", "nope"]) == 2
