"""The compile gate in real trainer runs (CPU, torch.compile'd drafter step, inductor)."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.trainer import make_synth, make_target, markers, run_trainer, \
    tiny_config, tiny_overrides  # noqa: E402
from trainer.compile.gate import RecompileAfterWarmup  # noqa: E402

THREADS3 = {"parallel.layout": "threads", "parallel.drafter_devices": "[cpu,cpu,cpu]",
            "compile.enabled": "true", "compile.gate": "true"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=32), d


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One inductor cache for this session's compile tests (the first run fills it)."""
    return str(tmp_path_factory.getbasetemp() / "dfo-inductor-cache")


def test_threads_three_drafters_gate_on_five_runs_no_error(tiny, tmp_path, inductor_cache):
    target, data, _ = tiny
    for i in range(5):
        args = ["train", *tiny_overrides(target, data, str(tmp_path / f"run{i}"), **{
            "train.max_steps": 3, "train.micro_batch": 4, "checkpoint.save_final": "false",
            **THREADS3})]
        r = run_trainer(args, env={"TORCHINDUCTOR_CACHE_DIR": inductor_cache}, timeout=300)
        assert r.returncode == 0, f"run {i}: {r.stderr[-3000:]}"
        assert [m["step"] for m in markers(r.stdout) if m["kind"] == "step"] == [1, 2, 3]
        warmed = [ln for ln in r.stdout.splitlines() if ln.startswith("warmup: cpu")]
        assert len(warmed) == 3 and "drafter replica 2" in warmed[-1]  # every replica warmed
        assert "symbolically trace" not in r.stderr


def test_recompile_after_warmup_is_a_clear_error_naming_the_shape(tiny, tmp_path,
                                                                  inductor_cache, monkeypatch):
    from trainer.telemetry import metrics
    from trainer.core import step as S
    from trainer.parallel.threads import ThreadsLayout

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", inductor_cache)
    target, data, _ = tiny
    cfg = tiny_config(target, data, str(tmp_path / "run"), **{
        "train.micro_batch": 4, **THREADS3, "parallel.drafter_devices": "[cpu,cpu]"})
    layout = ThreadsLayout(cfg)
    try:
        recs = layout.warmup(metrics.Emitter(None, out=io.StringIO()), 5.0)
        assert [r["shape"] for r in recs] == [[64, 8], [64, 8]]
        assert layout.gate.sealed
        ok = S.dummy_batch(cfg, 64, 8, 4, "cpu")
        layout.grads([ok, ok])  # warmed shape: fine
        bad = S.dummy_batch(cfg, 96, 8, 4, "cpu")
        with pytest.raises(RecompileAfterWarmup) as ei:
            layout.grads([bad, ok])
        assert "shape (seq_len=96, anchors=8) on cpu was not warmed up" in str(ei.value)
        # past the shape check, torch itself refuses to compile and the gate names it
        feats = S.target_features(layout.target, bad, cfg)
        with pytest.raises(RecompileAfterWarmup) as ei:
            S.drafter_loss(layout.drafter, feats, bad, cfg, layout.rt)
        msg = str(ei.value)
        assert "drafter_step needed a compile after warm-up" in msg
        assert "size mismatch" in msg and "actual 160" in msg  # torch's guard, 96+8*8 keys
        assert "batch (seq_len=96, anchors=8)" in msg  # the last batch this thread checked
        assert "\n" not in msg
    finally:
        layout.close()
    assert not layout.gate.sealed
