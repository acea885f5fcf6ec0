"""model.method dflash2 on CPU: config errors, the architecture's invariants, the objective,
a tiny training run (loss falls, exact resume), and the export round trip."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

from tests.helpers.trainer import make_synth, make_target, tiny_config
from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import load_config
from trainer.model import attention, blocks
from trainer.core import objective, objective_dflash2

D2 = {"model.method": "dflash2", "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]",
      "model.selector_rank": 8, "model.selector_top_k": 4, "model.sliding_window": 24}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash2")
    return {"dir": d, "target": make_target(str(d / "target")),
            "data": make_synth(str(d / "synth.jsonl"), num=48)}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train(env, run, resume=None, **kw):
    from trainer.train.loop import train

    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / run), **{**D2, **kw})
    return train(cfg, resume=resume, out=io.StringIO())


def _losses(run_dir) -> dict[int, float]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def _models(env, **kw):
    from trainer.core.step import build_models

    return build_models(tiny_config(env["target"], env["data"], str(env["dir"] / "m"),
                                    **{**D2, **kw}), "cpu")


def _batch(seed=0, s=48, n=4, b=2):
    from trainer.core.step import dummy_batch

    cfg = load_config(None, ["--data.path", "x", "--model.block_size", "8"])
    return dummy_batch(cfg, s, n, b, "cpu", seed=seed)


def _hidden(drafter, target, batch, window):
    feats = target.features(batch.input_ids)
    ids = blocks.block_input_ids(batch.input_ids, batch.anchors, batch.anchor_valid, 8,
                                 drafter.mask_token_id)
    pos = blocks.block_positions(batch.anchors, 8)
    mask = attention.build_mask("sdpa", batch.anchors, batch.anchor_valid,
                                batch.input_ids.shape[1], 8, window)
    return drafter(feats, ids, pos, lambda q, k, v: attention.attend("sdpa", q, k, v, mask))


@pytest.mark.parametrize("flag,value,msg", [
    ("model.method", "dflash3", "--model.method: expected one of dflash, dflash2"),
    ("model.conv_kernel_size", "9", "--model.conv_kernel_size: must be <= model.block_size"),
    ("model.sliding_window", "4", "--model.sliding_window: must be 0 or >= model.block_size"),
    ("model.selector_top_k", "0", "--model.selector_top_k: expected a positive integer"),
    ("model.final_logit_softcapping", "0", "--model.final_logit_softcapping: expected a positive"),
    ("train.selector_loss_alpha", "-1", "--train.selector_loss_alpha: expected a finite number"),
])
def test_config_errors_name_the_flag(flag, value, msg):
    base = ["--data.path", "x", "--model.block_size", "8", "--model.method", "dflash2"]
    with pytest.raises(TrainerConfigError, match=msg.replace("(", r"\(")):
        load_config(None, base + [f"--{flag}", value])


def test_target_shape_errors_name_the_flag(env):
    with pytest.raises(TrainerConfigError, match=r"--model.conv_group_size: 48 does not divide"):
        _models(env, **{"model.conv_group_size": 48})
    with pytest.raises(TrainerConfigError, match=r"--model.selector_top_k: 999 exceeds"):
        _models(env, **{"model.selector_top_k": 999})


def test_fresh_dflash2_computes_what_dflash_does(env):
    """Identity convs at init: with the DFlash layers' weights and no window, the same hidden."""
    target, d2 = _models(env, **{"model.sliding_window": 0})
    _, d1 = _models(env, **{"model.method": "dflash"})
    d1.load_trainable_state_dict({k: v for k, v in d2.trainable_state_dict().items()
                                  if "_conv." not in k and "candidate_selector" not in k})
    b = _batch()
    with torch.no_grad():
        torch.testing.assert_close(_hidden(d2, target, b, 0), _hidden(d1, target, b, 0),
                                   rtol=0, atol=0)


def test_sliding_flex_mask_matches_torch_block_mask():
    g = torch.Generator().manual_seed(1)
    anchors, valid = blocks.sample_anchors(torch.ones(2, 300, dtype=torch.bool),
                                           torch.tensor([300, 170]), 20, 8, generator=g)
    for window in (16, 100):           # 0 (full DFlash visibility): tests/test_trainer_flex.py
        for causal in (False, True):
            ours = attention.flex_block_mask(anchors, valid, 300, 8, window=window,
                                             causal=causal).to_dense()
            ref = attention.reference_block_mask(anchors, valid, 300, 8, window=window,
                                                 causal=causal).to_dense()
            assert torch.equal(ours, ref), (window, causal)
    a, k = int(anchors[0, 3]), 5                             # slot 5 of block 3 (position a+5)
    for causal, own in ((False, range(8)), (True, range(k + 1))):
        row = blocks.visibility_mask(anchors, valid, 300, 8, 16, causal)[0, 3 * 8 + k]
        assert row[:300].nonzero().flatten().tolist() == list(range(max(0, a + k - 15), a))
        assert row[300:].nonzero().flatten().tolist() == [3 * 8 + j for j in own]


def test_flex_forward_matches_sdpa_with_a_window(env):
    """The window layers through flex_attention (uncompiled, forward: no backward on CPU)."""
    import warnings

    target, dr = _models(env)
    b = _batch(seed=4, s=64, n=6)
    feats = target.features(b.input_ids)
    ids = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, 8, dr.mask_token_id)
    pos = blocks.block_positions(b.anchors, 8)
    out = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for backend in ("sdpa", "flex-eager"):
            mask = attention.build_mask(backend, b.anchors, b.anchor_valid, 64, 8, 24)
            out[backend] = dr(feats, ids, pos,
                              lambda q, k, v, backend=backend, mask=mask: attention.attend(backend, q, k, v, mask))
    torch.testing.assert_close(out["flex-eager"], out["sdpa"], rtol=1e-4, atol=1e-4)


def test_gold_token_replaces_the_weakest_candidate():
    top = torch.tensor([[5, 2, 9], [5, 2, 9]])
    cand, where, contains = objective_dflash2.training_candidates(top, torch.tensor([2, 7]))
    assert cand.tolist() == [[5, 2, 9], [5, 2, 7]]
    assert where.tolist() == [1, 2] and contains.tolist() == [True, False]


def test_chunked_loss_and_gradient_match_the_reference(env):
    target, dr = _models(env, **{"model.final_logit_softcapping": 4.0,
                                 "model.output_multiplier": 0.6})
    with torch.no_grad():   # a selector that does something
        dr.candidate_selector.successor_codebook.normal_(0, 0.5)
    b = _batch(seed=2)
    labels, weights, counted = objective.labels_and_weights(b.input_ids, b.loss_mask, b.anchors,
                                                            b.anchor_valid, 8, 4.0)
    h = _hidden(dr, target, b, 24).detach()
    h1, h2 = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    loss, m = objective_dflash2.dflash2_loss(dr, h1, labels, weights, counted, alpha=0.5, chunk=7)
    ref = objective_dflash2.reference_dflash2_loss(dr, h2, labels, weights, alpha=0.5)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-7)
    assert m["count_per_pos"].sum() > 0 and m["correct_per_pos"].shape == (7,)


def test_tiny_run_trains_and_resumes_exactly(env):
    # with gold insertion every slot has a selector term from step 1, so the loss this checks
    # holds the selector's own learning (the default rule's run: test_dflash2_selector_loss.py)
    common = {"train.schedule_steps": 30, "checkpoint.every": 0, "train.lr": 1e-2,
              "train.selector_gold_insert": "true"}
    assert _train(env, "full", **common, **{"train.max_steps": 30}) == 0
    full = _losses(env["dir"] / "full")
    assert full[30] < full[1] - 1.0, full
    assert _train(env, "part", **common, **{"train.max_steps": 12}) == 0
    assert _train(env, "part", resume="latest", **common, **{"train.max_steps": 30}) == 0
    part = _losses(env["dir"] / "part")
    assert sorted(part) == list(range(1, 31))
    assert [part[s] for s in range(13, 31)] == [full[s] for s in range(13, 31)]   # bit-identical


def test_export_round_trip(env, tmp_path):
    from safetensors import safe_open

    from trainer.evaluate.export_dir import export, load_exported, verify_export
    from trainer.core import checkpoints

    ck = env["dir"] / "full" / "checkpoints" / "step_30"
    if not ck.is_dir():
        assert _train(env, "full", **{"train.max_steps": 30, "train.schedule_steps": 30,
                                      "checkpoint.every": 0, "train.lr": 1e-2}) == 0
    target, dr = _models(env)
    checkpoints.load(str(ck), drafter=dr, restore_rng=False)
    export(str(ck), str(tmp_path / "x"), dtype="fp32")
    out = tmp_path / "x"
    assert verify_export(str(out)) == (True, "ok")
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["DFlash2DraftModel"] and conf["is_causal"] is False
    assert conf["dflash_config"] == {
        "mask_token_id": dr.mask_token_id, "target_layer_ids": [1, 2], "block_size": 8,
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4,
        "final_logit_softcapping": 20.0, "output_multiplier": 1.0,
        "causal": False}   # vLLM before 0.28 and LMDeploy read this, not is_causal
    assert conf["layer_types"] == ["sliding_attention"] * 2 and conf["sliding_window"] == 24
    assert conf["use_sliding_window"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    for n in ("candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
              "candidate_selector.successor_codebook", "layers.1.attention_conv.base_kernel",
              "layers.1.attention_conv.kernel_projection.weight", "layers.0.mlp_conv.base_kernel",
              "layers.0.mlp_conv.kernel_projection.weight", "layers.0.self_attn.q_proj.weight"):
        assert n in names
    re = load_exported(str(out), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    assert re.method == "dflash2" and re.d2 == dr.d2
    b = _batch(seed=3)
    with torch.no_grad():
        h_re, h_dr = _hidden(re, target, b, 24), _hidden(dr, target, b, 24)
        torch.testing.assert_close(h_re, h_dr, rtol=0, atol=1e-6)
        anchor = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, 8, 3)[:, ::8]
        assert torch.equal(re.greedy_path(h_re.view(2, 4, 8, -1), anchor),
                           dr.greedy_path(h_dr.view(2, 4, 8, -1), anchor))


def test_speculative_decoding_with_an_exported_dflash2_is_lossless(env, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.evaluate import spec_eval
    from trainer.evaluate.export_dir import export, load_exported

    ck = env["dir"] / "full" / "checkpoints" / "step_30"
    if not ck.is_dir():
        assert _train(env, "full", **{"train.max_steps": 30, "train.schedule_steps": 30,
                                      "checkpoint.every": 0, "train.lr": 1e-2}) == 0
    export(str(ck), str(tmp_path / "x"), dtype="fp32")
    model = AutoModelForCausalLM.from_pretrained(env["target"], local_files_only=True,
                                                 dtype=torch.float32).eval()
    dr = load_exported(str(tmp_path / "x"), embed_tokens=model.get_input_embeddings(),
                       lm_head=model.get_output_embeddings()).eval()
    target = spec_eval.Tapped(model, dr.target_layer_ids)
    for prompt in ([5, 6, 7], [40, 41, 42, 43, 44, 45, 46]):
        base = spec_eval.greedy(target, prompt, 30, "cpu")
        spec = spec_eval.speculative(target, dr, prompt, 30, "cpu")
        assert spec.tokens == base.tokens
        assert all(1 <= a <= 8 for a in spec.accept_lengths)


@pytest.mark.parametrize("vocab", [151936, 151936 + 77, 4096])
def test_two_stage_topk_is_torch_topk(vocab):
    """The selector's candidates (``objective.topk_ids``): torch.topk's values and, with no
    equal values, its indices; a vocabulary that is not a multiple of the segment; a small one
    (one stage); a row of equal values keeps torch.topk's values."""
    from trainer.core.objective import topk_ids

    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(24, vocab, generator=g)
    ref = x.topk(16, dim=-1)
    got = topk_ids(x, 16)
    assert torch.equal(got, ref.indices)
    x[3] = 1.0
    x[5, -1] = 50.0                                 # the largest in the short last segment
    got = topk_ids(x, 16)
    assert torch.equal(x.gather(1, got), x.topk(16, dim=-1).values)
    assert int(got[5, 0]) == vocab - 1 and len(set(got[3].tolist())) == 16
