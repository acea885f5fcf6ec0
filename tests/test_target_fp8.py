"""``model.target_fp8``: the frozen target's decoder-layer linears with fp8 weights and
rowwise scales (trainer.model.fp8), run for real through ``torch._scaled_mm`` on the CPU."""

from __future__ import annotations

import io
import json
import os

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.trainer import make_synth, make_target, tiny_config  # noqa: E402
from dfo_contract.env_fingerprint import EnvFingerprint  # noqa: E402
from dfo_contract.exitcodes import TrainerConfigError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfp8")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=16), d


def test_fp8_linear_is_close_to_the_linear_and_holds_fp8_weights():
    from trainer.model.fp8 import FP8, Fp8Linear, convert_linears, quantize_rows

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 256, generator=g) * 0.05)
    x = torch.randn(3, 7, 256, generator=g)
    q = Fp8Linear(lin)
    assert q.weight_fp8.dtype == FP8 and tuple(q.weight_fp8.shape) == (96, 256)
    assert tuple(q.weight_scale.shape) == (1, 96)
    with torch.no_grad():
        ref, got = lin(x), q(x)
    assert got.shape == ref.shape and got.dtype == x.dtype
    rel = float((got - ref).norm() / ref.norm())
    assert 1e-4 < rel < 0.08, rel          # fp8's rounding: present, and small
    # each row of a quantized tensor reaches fp8's largest value exactly (its own scale)
    xq, xs = quantize_rows(x.reshape(-1, 256))
    assert torch.equal(xq.float().abs().amax(-1), torch.full((21,), 448.0))
    assert torch.allclose(xq.float() * xs, x.reshape(-1, 256), rtol=0.07, atol=1e-6)
    # conversion: bias-free linears only, idempotent
    m = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8))
    assert convert_linears(m) == 1 and convert_linears(m) == 0
    assert isinstance(m[0], Fp8Linear) and type(m[1]) is torch.nn.Linear


def test_training_with_an_fp8_target(tiny, tmp_path):
    """The decoder layers' linears hold fp8 weights (the embedding and the shared LM head do
    not), the features stay close to the full-precision target's, and a run trains with it."""
    from trainer.model.fp8 import Fp8Linear
    from trainer.core import step as S
    from trainer.train.loop import train

    target, data, _ = tiny
    ref_cfg = tiny_config(target, data, str(tmp_path / "ref"))
    cfg = tiny_config(target, data, str(tmp_path / "fp8"), **{"model.target_fp8": "true",
                                                               "train.max_steps": 2,
                                                               "checkpoint.save_final": "false"})
    t_ref, _ = S.build_models(ref_cfg, "cpu")
    t8, d8 = S.build_models(cfg, "cpu")
    layers = t8.model.model.layers
    n = sum(isinstance(m, Fp8Linear) for m in layers.modules())
    assert n == t8.fp8_linears == 7 * len(layers)   # q k v o gate up down per layer
    assert type(t8.lm_head) is torch.nn.Linear and d8.shared.lm_head is t8.lm_head
    batch = S.dummy_batch(cfg, 32, 4, 2, "cpu")
    f_ref, f8 = S.target_features(t_ref, batch, ref_cfg), S.target_features(t8, batch, cfg)
    rel = float((f8 - f_ref).norm() / f_ref.norm())
    assert 1e-4 < rel < 0.2, rel
    out = io.StringIO()
    assert train(cfg, out=out) == 0
    with open(os.path.join(cfg.run.dir, "metrics.jsonl")) as f:
        losses = [json.loads(ln)["loss"] for ln in f if '"loss"' in ln]
    assert len(losses) == 2 and all(v == v and v < 1e3 for v in losses)


def test_target_fp8_is_a_checked_flag_and_part_of_the_cache_key(tiny, tmp_path):
    from orchestrator.plan import cache_key as ck

    target, data, _ = tiny
    with pytest.raises(TrainerConfigError, match="--model.target_fp8: expected true or false"):
        tiny_config(target, data, str(tmp_path), **{"model.target_fp8": "yes please"})
    fp = EnvFingerprint(profile="p", torch="2.13.0", cuda_available=False)
    keys = [ck.compute_key(fp, tiny_config(target, data, str(tmp_path), **{
        "model.target_fp8": v}).to_dict(), trainer_source="s") for v in ("false", "true")]
    assert ck.diff_components(keys[0].components, keys[1].components) == [
        ("config.model.target_fp8", "false", "true")]


def test_fp8_training_evaluates_on_the_served_target_and_its_export_says_fp8(tiny, tmp_path):
    """With model.target_fp8 the held-out evaluation runs on the full-precision target by
    default (eval.target served: the fp8 layers compute with their kept weights, so the
    features are the unconverted target's exactly) and says so; eval.target train keeps the
    fp8 layers. The export records that the drafter learned from fp8 features."""
    from trainer.core import step as S
    from trainer.evaluate.export_dir import MANIFEST, export
    from trainer.train.loop import train

    target, data, _ = tiny
    kw = {"model.target_fp8": "true", "train.max_steps": 2, "eval.every": 2,
          "data.eval_path": data, "eval.max_samples": 8}
    ref_cfg = tiny_config(target, data, str(tmp_path / "ref"))
    cfg = tiny_config(target, data, str(tmp_path / "served"), **kw)
    t_ref, _ = S.build_models(ref_cfg, "cpu")
    t8, _ = S.build_models(cfg, "cpu")
    batch = S.dummy_batch(cfg, 32, 4, 2, "cpu")
    f_ref = S.target_features(t_ref, batch, ref_cfg)
    with t8.served() as ran:
        assert ran == "served"
        assert torch.equal(S.target_features(t8, batch, cfg), f_ref)
    assert not torch.equal(S.target_features(t8, batch, cfg), f_ref)   # fp8 again after

    def evals(run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("phase") == "eval"]
    out = io.StringIO()
    assert train(cfg, out=out) == 0
    assert [r["eval_target"] for r in evals(cfg.run.dir)] == ["served"]
    assert "full-precision target as served" in out.getvalue()
    trained = tiny_config(target, data, str(tmp_path / "train"), **kw, **{"eval.target": "train"})
    assert train(trained, out=io.StringIO()) == 0
    assert [r["eval_target"] for r in evals(trained.run.dir)] == ["fp8"]
    with pytest.raises(TrainerConfigError, match="eval.target"):
        tiny_config(target, data, str(tmp_path), **{"eval.target": "bf16"})

    ckpt = os.path.join(cfg.run.dir, "checkpoints", "step_2")
    man = export(ckpt, str(tmp_path / "exp"), dtype="fp32")
    assert man["target_precision"] == "fp8"
    with open(tmp_path / "exp" / MANIFEST) as f:
        assert json.load(f)["target_precision"] == "fp8"
    assert "Trained on fp8 target features" in (tmp_path / "exp" / "README.md").read_text()
    full = tiny_config(target, data, str(tmp_path / "full"), **{"train.max_steps": 2})
    assert train(full, out=io.StringIO()) == 0
    plain = export(os.path.join(full.run.dir, "checkpoints", "step_2"), str(tmp_path / "exp2"),
                   dtype="fp32")
    assert plain["target_precision"] == "full"
    assert "Trained on fp8" not in (tmp_path / "exp2" / "README.md").read_text()
