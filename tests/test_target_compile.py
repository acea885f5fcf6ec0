"""``compile.target``: the target's decoder layers compiled under the compile gate (CPU,
inductor), its config check, its compile-cache key component and its fallback step."""

from __future__ import annotations

import io
import json
import os
import re

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.trainer import make_synth, make_target, tiny_config  # noqa: E402
from dfo_contract.env_fingerprint import EnvFingerprint  # noqa: E402
from dfo_contract.exitcodes import TrainerConfigError  # noqa: E402

ON = {"compile.gate": "true", "compile.target": "true"}  # the drafter step stays eager


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tcompile")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=24), d


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(cfg, rt=None) -> tuple[dict[int, float], list[dict], str]:
    from trainer.train.loop import train

    out = io.StringIO()
    assert train(cfg, out=out, rt=rt) == 0
    with open(os.path.join(cfg.run.dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    losses = {r["step"]: r["loss"] for r in recs if "loss" in r and r.get("phase") == "train"}
    return losses, [r for r in recs if "accept_len" in r], out.getvalue()


def test_training_with_the_target_compiled_matches_eager_target(tiny, tmp_path):
    """Same data, same eager drafter step: the compiled target gives the eager target's
    losses. The compiled run is warmed and sealed by the gate with two target workers for
    one drafter (threads layout), so the second target is warmed by its own unit, and it
    evaluates a held-out set whose last batch is shorter than the warmed one (eval runs the
    target eagerly: the sealed gate would refuse that shape)."""
    from trainer.core.runtime import Runtime

    target, data, _ = tiny
    common = {"train.max_steps": 3, "train.micro_batch": 4, "checkpoint.save_final": "false"}
    ref_cfg = tiny_config(target, data, str(tmp_path / "ref"), **common)
    assert ref_cfg.compile.target is False and not ref_cfg.compile.enabled  # all eager
    ref, _, ref_out = _run(ref_cfg)
    assert "compile: target" not in ref_out and "+ target layers" not in ref_out

    cfg = tiny_config(target, data, str(tmp_path / "on"), **common, **ON, **{
        "parallel.layout": "threads", "parallel.target_devices": "[cpu,cpu]",
        "data.eval_path": data, "eval.every": 3, "eval.max_samples": 3})
    rt = Runtime.create()
    got, evals, out = _run(cfg, rt)
    assert sorted(got) == [1, 2, 3]
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=1e-4, abs=1e-5), (s, got, ref)
    assert "target_layer[Qwen3DecoderLayer]" in rt.compile.names()
    lines = out.splitlines()
    assert any(ln.startswith("compile: target: 3 decoder layers compiled as "
                             "target_layer[Qwen3DecoderLayer]") for ln in lines), out
    warm = [ln for ln in lines if ln.startswith("warmup: cpu")]
    assert len(warm) == 2, out
    assert "drafter replica 0 + target layers" in warm[0] and "target layers 1" in warm[1]
    hit, miss = map(int, re.search(r"fxgraph hit (\d+) miss (\d+)", warm[0]).groups())
    assert hit + miss >= 1  # inductor built (or loaded) the layer graph in the warm-up
    assert evals and evals[0]["step"] == 3 and evals[0]["accept_len"] is not None


def test_config_errors_name_the_flag(tiny, tmp_path):
    target, data, _ = tiny
    with pytest.raises(TrainerConfigError) as ei:
        tiny_config(target, data, str(tmp_path), **{"compile.target": "maybe"})
    assert str(ei.value) == "config: --compile.target: expected true or false, got 'maybe'"
    from trainer.compile.registry import CompileRegistry
    from trainer.compile.target import compile_layers
    from trainer.model.target import load_target

    t = load_target(target, device="cpu", dtype=torch.float32, num_drafter_layers=1)
    with pytest.raises(ValueError, match="CUDA graphs, which overwrite the tapped layer outputs"):
        compile_layers(CompileRegistry(), t, "reduce-overhead")
    assert t.compiled_layers == ""


def test_recompile_limit_counts_the_target_variants(tiny, tmp_path):
    from trainer.core import step as S

    target, data, _ = tiny
    cfg = tiny_config(target, data, str(tmp_path), **ON, **{
        "data.seq_buckets": "[32,64]", "data.anchor_buckets": "[8]"})
    assert S.compile_variants(cfg, 1, 5) == 10          # 2 sequence buckets x 5 target devices
    cfg.compile.target = False
    assert S.compile_variants(cfg, 1, 5) == 2           # the drafter step's buckets only


def test_compile_cache_key_differs_with_target_compile(tiny, tmp_path):
    from orchestrator.plan import cache_key as ck

    target, data, _ = tiny
    fp = EnvFingerprint(profile="p", torch="2.13.0", cuda_available=False)
    keys = {}
    for on in (False, True):
        cfg = tiny_config(target, data, str(tmp_path), **{**ON, "compile.target": str(on).lower()})
        keys[on] = ck.compute_key(fp, cfg.to_dict(), trainer_source="s")
    assert keys[False].key != keys[True].key
    assert ck.diff_components(keys[False].components, keys[True].components) == [
        ("config.compile.target", "false", "true")]


def test_target_compile_off_is_the_compile_ladders_first_step():
    from orchestrator.common.fallback import DEFAULT_LADDERS, STEPS, next_config

    base = {"compile.enabled": True, "compile.gate": False, "compile.target": True,
            "parallel.layout": "threads", "parallel.drafter_devices": ["cuda:0", "cuda:1"]}
    ov = {"x.y": 1}
    assert STEPS["target_compile_off"](base, ov) == {"x.y": 1, "compile.target": False}
    assert ov == {"x.y": 1}  # pure
    assert STEPS["target_compile_off"](dict(base, **{"compile.target": False}), ov) is None
    for cls in ("fx_trace_race", "compile_hang", "dense_fallback", "compile_error"):
        c = next_config(cls, DEFAULT_LADDERS[cls], 0, base, {})
        assert (c.step, c.changed, c.restore_cache) == (
            "target_compile_off", {"compile.target": False}, False), cls
        # the next failure goes on to the class's next step (compile_error: restart unchanged)
        n = next_config(cls, DEFAULT_LADDERS[cls], c.position, base, c.overrides)
        assert n.step != "target_compile_off" and n.overrides["compile.target"] is False
    # a crash without a failed compile in its output keeps the target compiled
    c = next_config("crash", DEFAULT_LADDERS["crash"], 0, base, {})
    assert (c.step, c.changed, c.overrides, c.exhausted) == (None, {}, {}, False)
    # a run that does not compile the target skips it
    c = next_config("fx_trace_race", DEFAULT_LADDERS["fx_trace_race"], 0,
                    dict(base, **{"compile.target": False}), {})
    assert c.step == "compile_gate"
    # the gate is worth turning on when only the target compiles, not when nothing does
    eager = dict(base, **{"compile.enabled": False})
    assert STEPS["compile_gate"](eager, {}) == {"compile.gate": True}
    assert STEPS["compile_gate"](dict(eager, **{"compile.target": False}), {}) is None


def test_target_dynamic_compiles_the_layers_once_for_every_bucket(tiny, tmp_path):
    """``compile.target_dynamic``: one dynamic-shape layer graph serves both sequence buckets
    (the second bucket's warm-up builds and loads nothing), and training gives the eager
    target's losses."""
    from trainer.core.runtime import Runtime

    target, data, _ = tiny
    common = {"train.max_steps": 2, "train.micro_batch": 4, "checkpoint.save_final": "false",
              "data.seq_buckets": "[32,64]"}
    ref, _, _ = _run(tiny_config(target, data, str(tmp_path / "ref"), **common))
    rt = Runtime.create()
    got, _, out = _run(tiny_config(target, data, str(tmp_path / "dyn"), **common, **ON,
                                   **{"compile.target_dynamic": "true"}), rt)
    assert sorted(got) == sorted(ref) == [1, 2]
    for s in ref:
        assert got[s] == pytest.approx(ref[s], rel=1e-4, abs=1e-5), (s, got, ref)
    assert "target_layer[Qwen3DecoderLayer, dynamic]" in rt.compile.names()
    lines = out.splitlines()
    assert any(ln.startswith("compile: target: 3 decoder layers compiled as target_layer[Qwen3"
                             "DecoderLayer, dynamic] (one graph per device,") for ln in lines), out
    warm = [ln for ln in lines if ln.startswith("warmup: cpu")]
    assert [("seq_len=32" in w, "seq_len=64" in w) for w in warm] == [(True, False), (False, True)], out
    first, second = (tuple(map(int, re.search(r"fxgraph hit (\d+) miss (\d+)", w).groups()))
                     for w in warm)
    assert sum(first) >= 1 and second == (0, 0), out


def test_overlap_target_off_cuda_trains_as_without(tiny, tmp_path):
    """``parallel.overlap_target`` needs a CUDA target; on the CPU the layout runs the
    micro-batches as without it (same losses), and the flag is a checked boolean."""
    target, data, _ = tiny
    common = {"train.max_steps": 2, "train.micro_batch": 2, "train.grad_accum": 2,
              "checkpoint.save_final": "false"}
    ref, _, _ = _run(tiny_config(target, data, str(tmp_path / "ref"), **common))
    got, _, _ = _run(tiny_config(target, data, str(tmp_path / "ov"), **common,
                                 **{"parallel.overlap_target": "true"}))
    assert got == ref
    with pytest.raises(TrainerConfigError, match="--parallel.overlap_target: expected true or false"):
        tiny_config(target, data, str(tmp_path), **{"parallel.overlap_target": "2"})
