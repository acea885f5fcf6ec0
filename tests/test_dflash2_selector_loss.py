"""DFlash2's selector loss as current SpecForge trains it: no term for a slot whose gold token
is outside the unary top-k (gold insertion behind a flag), the warm-up and ramp of its weight,
the stop-gradient, and a weight of 0 freezing the selector (real tiny models on CPU)."""

from __future__ import annotations

import io
import json

import pytest
import torch

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import load_config
from tests.helpers.trainer import make_synth, make_target, tiny_config
from trainer.model import attention, blocks
from trainer.core import objective, objective_dflash2

D2 = {"model.method": "dflash2", "model.drafter_layers": 1, "model.target_layer_ids": "[1,2]",
      "model.selector_rank": 8, "model.selector_top_k": 4, "model.sliding_window": 24}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("sel")
    return {"dir": d, "target": make_target(str(d / "target")),
            "data": make_synth(str(d / "synth.jsonl"), num=32)}


def _setup(env, **kw):
    from trainer.core.step import build_models, dummy_batch

    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / "m"), **{**D2, **kw})
    target, dr = build_models(cfg, "cpu")
    with torch.no_grad():
        dr.candidate_selector.successor_codebook.normal_(0, 0.5)
    b = dummy_batch(cfg, 48, 4, 2, "cpu", seed=5)
    feats = target.features(b.input_ids)
    ids = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, 8, dr.mask_token_id)
    pos = blocks.block_positions(b.anchors, 8)
    masks = attention.build_masks("sdpa", b.anchors, b.anchor_valid, 48, 8, dr.spec.pattern)
    lw = objective.labels_and_weights(b.input_ids, b.loss_mask, b.anchors, b.anchor_valid, 8, 4.0)
    return cfg, dr, (feats, ids, pos, masks), lw


def _loss(dr, inputs, lw, **kw):
    feats, ids, pos, masks = inputs
    h = dr(feats, ids, pos, attention.layer_attends("sdpa", masks))
    return objective_dflash2.dflash2_loss(dr, h, *lw, chunk=5, **kw)[0], h


def test_a_gold_token_outside_the_top_k_has_no_selector_term(env):
    _, dr, inputs, lw = _setup(env)
    labels, weights, _ = lw
    with torch.no_grad():
        for insert in (False, True):
            h = dr(*inputs[:3], attention.layer_attends("sdpa", inputs[3]))
            ours = objective_dflash2.dflash2_loss(dr, h, *lw, alpha=0.7, chunk=5, gold_insert=insert)[0]
            ref = objective_dflash2.reference_dflash2_loss(dr, h, labels, weights, alpha=0.7, gold_insert=insert)
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        # top-k 4 of a 128-token vocabulary on an untrained drafter misses most gold tokens:
        # the two rules differ
        h = dr(*inputs[:3], attention.layer_attends("sdpa", inputs[3]))
        a = objective_dflash2.dflash2_loss(dr, h, *lw, alpha=1.0, chunk=5)[0]
        b = objective_dflash2.dflash2_loss(dr, h, *lw, alpha=1.0, chunk=5, gold_insert=True)[0]
        assert float(b) > float(a) + 1e-3


def test_stop_gradient_keeps_the_selector_term_out_of_the_backbone(env):
    _, dr, inputs, lw = _setup(env, **{"train.selector_gold_insert": "true"})
    grads = {}
    for name, kw in (("unary", {"alpha": None}), ("stop", {"alpha": 1.0, "stop_gradient": True}),
                     ("full", {"alpha": 1.0})):
        dr.zero_grad(set_to_none=True)
        loss, _ = _loss(dr, inputs, lw, gold_insert=True, **kw)
        loss.backward()
        grads[name] = (dr.fc.weight.grad.clone(),
                       None if dr.candidate_selector.hidden_projection.weight.grad is None
                       else dr.candidate_selector.hidden_projection.weight.grad.clone())
    torch.testing.assert_close(grads["stop"][0], grads["unary"][0], rtol=1e-5, atol=1e-8)
    assert not torch.allclose(grads["full"][0], grads["unary"][0], atol=1e-7)
    assert grads["stop"][1] is not None and grads["stop"][1].abs().sum() > 0   # the selector trains
    assert grads["unary"][1] is None


def test_warmup_and_ramp_schedule():
    t = load_config(None, ["--data.path", "x", "--model.method", "dflash2", "--model.block_size", "8",
                           "--train.selector_loss_alpha", "2", "--train.selector_warmup_ratio", "0.1",
                           "--train.selector_ramp_ratio", "0.2"]).train
    got = [objective_dflash2.selector_alpha_at(t, s, 100) for s in (0, 9, 10, 19, 29, 30, 99)]
    assert got == [0.0, 0.0, 0.1, 1.0, 2.0, 2.0, 2.0]
    t.selector_warmup_ratio = t.selector_ramp_ratio = 0.0
    assert objective_dflash2.selector_alpha_at(t, 0, 100) == 2.0
    with pytest.raises(TrainerConfigError, match="--train.selector_ramp_ratio: warm-up 0.6 \\+ ramp 0.6"):
        load_config(None, ["--data.path", "x", "--model.method", "dflash2", "--model.block_size", "8",
                           "--train.selector_warmup_ratio", "0.6", "--train.selector_ramp_ratio", "0.6"])


def test_alpha_zero_freezes_the_selector_in_a_real_run(env):
    from trainer.core import checkpoints
    from trainer.train.loop import train
    from trainer.core.step import build_models

    frozen = env["dir"] / "frozen"
    cfg0 = tiny_config(env["target"], env["data"], str(frozen), **{
        **D2, "train.max_steps": 3, "train.selector_loss_alpha": 0, "checkpoint.every": 0})
    _, fresh = build_models(cfg0, "cpu")
    assert not any(p.requires_grad for p in fresh.candidate_selector.parameters())
    before = {k: v.clone() for k, v in fresh.trainable_state_dict().items()}
    assert train(cfg0, out=io.StringIO()) == 0
    _, after = build_models(cfg0, "cpu")
    checkpoints.load(str(frozen / "checkpoints" / "step_3"), drafter=after, restore_rng=False)
    sd = after.trainable_state_dict()
    for k, v in sd.items():
        if k.startswith("candidate_selector."):
            assert torch.equal(v, before[k]), k
    assert not torch.equal(sd["fc.weight"], before["fc.weight"])
    assert json.loads((frozen / "metrics.jsonl").read_text().splitlines()[-1])["loss"] > 0
