"""The DFlash objective and drafter on CPU: mask, labels, loss, gradients, invariances."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.trainer import make_synth, make_target, tiny_config
from trainer.model import attention, blocks
from trainer.core import objective, step
from dfo_contract.exitcodes import TrainerConfigError
from trainer.model.target import tapped_layer_ids

B = 8


def _anchors_case():
    # 2 sequences, S=40, N=4 slots; seq 1 has an invalid slot
    anchors = torch.tensor([[3, 10, 17, 30], [0, 5, 20, 0]])
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    return anchors, valid, 40


def test_visibility_equals_loop_reference():
    anchors, valid, s = _anchors_case()
    m = blocks.visibility_mask(anchors, valid, s, B)
    b, n = anchors.shape
    ref = torch.zeros(b, n * B, s + n * B, dtype=torch.bool)
    for bi in range(b):
        for q in range(n * B):
            blk = q // B
            if not valid[bi, blk]:
                continue
            for j in range(s + n * B):
                if j < s:
                    ref[bi, q, j] = j < anchors[bi, blk]  # strictly before the anchor
                else:
                    ref[bi, q, j] = (j - s) // B == blk
    assert torch.equal(m, ref)
    # the two public bugs: the anchor itself is never visible, invalid blocks see nothing
    assert not m[0, 0, 3] and m[0, 0, 2]
    assert not m[1, 3 * B:].any()


def test_labels_weights_equal_loop_reference():
    g = torch.Generator().manual_seed(1)
    anchors, valid, s = _anchors_case()
    ids = torch.randint(4, 128, (2, s), generator=g)
    lm = torch.rand(2, s, generator=g) > 0.2
    gamma = 4.0
    labels, weights, counted = objective.labels_and_weights(ids, lm, anchors, valid, B, gamma)
    for bi in range(2):
        for n in range(4):
            for k in range(B):
                a = int(anchors[bi, n])
                exp_label = int(ids[bi, min(a + k, s - 1)])
                assert int(labels[bi, n, k]) == exp_label
                on = bool(valid[bi, n]) and k >= 1 and bool(lm[bi, min(a + k, s - 1)])
                assert bool(counted[bi, n, k]) == on
                w = math.exp(-(k - 1) / gamma) if on else 0.0
                assert float(weights[bi, n, k]) == pytest.approx(w, rel=1e-6)
    # slot k of a valid block predicts x[anchor + k], NOT x[anchor + k + 1]
    assert int(labels[0, 1, 1]) == int(ids[0, 11])


def test_block_inputs_and_positions():
    anchors, valid, s = _anchors_case()
    ids = torch.arange(s).repeat(2, 1) + 10
    bi = blocks.block_input_ids(ids, anchors, valid, B, mask_token_id=3).view(2, 4, B)
    assert bi[0, :, 0].tolist() == [13, 20, 27, 40]
    assert (bi[:, :, 1:] == 3).all() and bi[1, 3, 0] == 3  # invalid block: all MASK
    pos = blocks.block_positions(anchors, B).view(2, 4, B)
    assert pos[0, 2].tolist() == list(range(17, 17 + B))


def test_sample_anchors_eligibility_and_order():
    s, b = 48, 64
    g = torch.Generator().manual_seed(0)
    lm = torch.rand(b, s, generator=g) > 0.3
    lens = torch.randint(20, s + 1, (b,), generator=g)
    for i in range(b):
        lm[i, lens[i]:] = False
    anchors, valid = blocks.sample_anchors(lm, lens, 6, B, generator=g)
    elig = blocks.eligible_anchors(lm, lens, B)
    for i in range(b):
        a = anchors[i][valid[i]].tolist()
        assert a == sorted(a) and len(set(a)) == len(a)
        assert len(a) == min(6, int(elig[i].sum()))
        for p in a:
            assert p <= lens[i] - 2 and lm[i, p] and lm[i, p + 1]
        assert (anchors[i][~valid[i]] == 0).all()
        if len(a) < 6:
            assert not valid[i, len(a):].any()


def test_sample_anchors_uniform():
    s = 24
    lm = torch.ones(1, s, dtype=torch.bool)
    lens = torch.tensor([s])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(s)
    for _ in range(3000):
        a, v = blocks.sample_anchors(lm, lens, 2, B, generator=g)
        counts[a[0][v[0]]] += 1
    elig = counts[: s - 1]          # SpecForge's rule: up to the second-to-last loss token
    assert counts[s - 1:].sum() == 0
    assert elig.min() > 0.75 * elig.mean() and elig.max() < 1.25 * elig.mean()


def test_chunked_ce_matches_reference_loss_and_grad():
    g = torch.Generator().manual_seed(0)
    b, n, v, h = 2, 3, 50, 16
    hidden = torch.randn(b, n * B, h, generator=g, requires_grad=True)
    w_head = torch.randn(v, h, generator=g)
    labels = torch.randint(0, v, (b, n, B), generator=g)
    counted = torch.rand(b, n, B, generator=g) > 0.3
    counted[:, :, 0] = False
    weights = objective.position_decay(B, 4.0).view(1, 1, -1) * counted.float()
    loss, m = objective.weighted_ce(hidden, w_head, labels, weights, counted, chunk=5)
    (gh,) = torch.autograd.grad(loss, hidden)
    h2 = hidden.detach().clone().requires_grad_(True)
    ref = objective.reference_loss(h2 @ w_head.t(), labels, weights)
    (gr,) = torch.autograd.grad(ref, h2)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh, gr, rtol=1e-4, atol=1e-6)
    pred = (h2 @ w_head.t()).argmax(-1).view(b, n, B)
    corr = ((pred == labels) & counted)[:, :, 1:].float().sum((0, 1))
    assert torch.equal(m["correct_per_pos"], corr)
    assert torch.equal(m["count_per_pos"], counted[:, :, 1:].float().sum((0, 1)))


def test_tau_from_accuracies():
    assert float(objective.tau_from_acc(torch.ones(B - 1))) == pytest.approx(B)
    assert float(objective.tau_from_acc(torch.zeros(B - 1))) == pytest.approx(1.0)
    acc = torch.full((B - 1,), 0.5)
    assert float(objective.tau_from_acc(acc)) == pytest.approx(objective.expected_tau_uniform(0.5, B))


def test_oracle_gets_tau_B_and_shifted_labels_get_tau_1():
    """Guard against the off-by-one label bug: an oracle for x[anchor+k] must score tau=B."""
    g = torch.Generator().manual_seed(3)
    s, v = 40, 64
    anchors, valid, _ = _anchors_case()
    ids = torch.randint(0, v, (2, s), generator=g)
    lm = torch.ones(2, s, dtype=torch.bool)
    labels, weights, counted = objective.labels_and_weights(ids, lm, anchors, valid, B, 4.0)
    eye = torch.eye(v)

    def score(target_ids):
        hidden = eye[target_ids.view(2, -1)] * 10.0  # logits = hidden @ I
        _, m = objective.weighted_ce(hidden, eye, labels, weights, counted)
        return objective.summarize([m])

    k = torch.arange(B).view(1, 1, -1)
    right = torch.gather(ids, 1, (anchors.unsqueeze(-1) + k).clamp(max=s - 1).view(2, -1)).view(2, 4, B)
    shifted = torch.gather(ids, 1, (anchors.unsqueeze(-1) + k + 1).clamp(max=s - 1).view(2, -1)).view(2, 4, B)
    good, bad = score(right), score(shifted)
    assert float(good["acc"]) == 1.0 and float(good["tau"]) == pytest.approx(B)
    assert float(bad["acc"]) < 0.2 and float(bad["tau"]) < 1.3


def test_sdpa_invalid_rows_zero_no_nan():
    anchors, valid, s = _anchors_case()
    mask = attention.build_mask("sdpa", anchors, valid, s, B)
    q = torch.randn(2, 4, 4 * B, 8, requires_grad=True)
    k = torch.randn(2, 2, s + 4 * B, 8, requires_grad=True)
    v = torch.randn(2, 2, s + 4 * B, 8, requires_grad=True)
    out = attention.attend("sdpa", q, k, v, mask)
    assert torch.isfinite(out).all()
    assert (out[1, :, 3 * B:] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_tapped_layer_ids():
    assert tapped_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert tapped_layer_ids(4, 1) == [2]
    assert tapped_layer_ids(4, 2, [1, 2]) == [1, 2]
    for t, n, ex, what in [(2, 2, None, "negative"), (4, 2, None, "duplicate"),
                           (4, 1, [4], "out of range"), (4, 2, [1, 1], "duplicate"),
                           (4, 1, [-1], "negative"), (4, 2, [1, 3], "last layer"),
                           (2, 1, None, "last layer")]:
        with pytest.raises(TrainerConfigError, match=what) as ei:
            tapped_layer_ids(t, n, ex)
        assert "--model.target_layer_ids" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(TrainerConfigError, match=r"tap layers 0\.\.2 with --model.target_layer_ids"):
        tapped_layer_ids(4, 2, [0, 3])


def test_tapping_the_last_layer_is_one_line_exit_2(tmp_path):
    from tests.helpers.trainer import run_trainer, tiny_overrides

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "synth.jsonl"), num=8)
    run = run_trainer(["train", *tiny_overrides(target, data, str(tmp_path / "run"), **{
        "model.drafter_layers": 2, "model.target_layer_ids": "[1,3]"})])
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "layer 3 is the last layer" in run.stderr and "tap layers 0..2 with --model.target_layer_ids" in run.stderr


# --------------------------------------------------------------------------- with the model

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    target = make_target(str(d / "target"))
    data = make_synth(str(d / "synth.jsonl"), num=16)
    cfg = tiny_config(target, data, str(d / "run"), **{"model.drafter_layers": 2,
                                                       "model.target_layer_ids": "[1,2]"})
    torch.manual_seed(0)
    tgt, drafter = step.build_models(cfg, "cpu")
    return cfg, tgt, drafter


def _batch(cfg, seed=0):
    return step.dummy_batch(cfg, 64, 4, 2, "cpu", seed=seed)


def _block_logits(drafter, features, batch, cfg):
    bs = cfg.model.block_size
    ids = blocks.block_input_ids(batch.input_ids, batch.anchors, batch.anchor_valid, bs,
                                    drafter.mask_token_id)
    pos = blocks.block_positions(batch.anchors, bs)
    mask = attention.build_mask("sdpa", batch.anchors, batch.anchor_valid, 64, bs)
    h = drafter(features, ids, pos, lambda q, k, v: attention.attend("sdpa", q, k, v, mask))
    return h @ drafter.shared.lm_head.weight.t()


def test_block_logits_ignore_context_at_or_after_anchor_and_other_blocks(tiny):
    cfg, tgt, drafter = tiny
    batch = _batch(cfg)
    batch.anchors[0] = torch.tensor([10, 20, 30, 40])
    feats = step.target_features(tgt, batch, cfg)
    with torch.no_grad():
        base = _block_logits(drafter, feats, batch, cfg)
        # block 1 (anchor 20): perturb context features at positions >= 20 and other blocks' tokens
        f2 = feats.clone()
        f2[0, 20:] += torch.randn_like(f2[0, 20:])
        b2 = step.Batch(**{**batch.__dict__, "input_ids": batch.input_ids.clone()})
        b2.input_ids[0, 10] = (b2.input_ids[0, 10] + 1) % 100 + 4   # block 0's anchor token
        b2.input_ids[0, 30] = (b2.input_ids[0, 30] + 1) % 100 + 4   # block 2's anchor token
        out = _block_logits(drafter, f2, b2, cfg)
        blk1 = slice(1 * B, 2 * B)
        torch.testing.assert_close(out[0, blk1], base[0, blk1], rtol=0, atol=1e-5)
        # ... but context strictly before the anchor matters (the check can fail)
        f3 = feats.clone()
        f3[0, 19] += 5.0
        assert not torch.allclose(_block_logits(drafter, f3, batch, cfg)[0, blk1], base[0, blk1])
        # and block 0 did see its changed anchor token
        assert not torch.allclose(out[0, 0:B], base[0, 0:B])


def test_embedding_and_lm_head_get_no_gradient(tiny):
    cfg, tgt, drafter = tiny
    batch = _batch(cfg, seed=1)
    feats = step.target_features(tgt, batch, cfg)
    assert not feats.requires_grad
    drafter.zero_grad(set_to_none=True)
    loss, _ = step.drafter_loss(drafter, feats, batch, cfg)
    loss.backward()
    assert drafter.shared.embed_tokens.weight.grad is None
    assert drafter.shared.lm_head.weight.grad is None
    assert all(p.grad is None for p in tgt.model.parameters())
    trainable = drafter.trainable_parameters()
    assert trainable and all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable)
    assert not any(k.startswith("shared.") for k in drafter.trainable_state_dict())
    drafter.zero_grad(set_to_none=True)


def test_loss_falls_when_overfitting_one_batch(tiny):
    cfg, tgt, drafter = tiny
    import copy

    d = copy.deepcopy(drafter)
    d.attn_backend, d.mask_token_id = drafter.attn_backend, drafter.mask_token_id
    opt = torch.optim.AdamW(d.trainable_parameters(), lr=1e-2)
    batch = _batch(cfg, seed=2)
    feats = step.target_features(tgt, batch, cfg)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss, _ = step.drafter_loss(d, feats, batch, cfg)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.75 * losses[0], losses
    assert losses[-1] < min(losses[:-1]), losses


def test_target_features_are_tapped_layer_outputs(tiny, tmp_path):
    cfg, tgt, _ = tiny
    from transformers import AutoModelForCausalLM

    from trainer.model.target import load_target

    t2 = load_target(cfg.model.target_path, device="cpu", dtype=torch.float32, num_drafter_layers=2,
                     tap_ids=[0, 2])
    assert len(t2.model.model.layers) == 3  # truncated after the last tapped layer
    ids = torch.randint(4, 128, (2, 16))
    full = AutoModelForCausalLM.from_pretrained(cfg.model.target_path, dtype=torch.float32)
    with torch.no_grad():
        hs = full(input_ids=ids, output_hidden_states=True).hidden_states
    feats = t2.features(ids)
    torch.testing.assert_close(feats, torch.cat([hs[1], hs[3]], dim=-1), rtol=1e-5, atol=1e-5)
