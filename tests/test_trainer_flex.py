"""The flex backend: the analytic BlockMask equals torch's, and compiled flex == sdpa (forward, CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.helpers.trainer import make_synth, make_target, tiny_config
from trainer.compile.registry import CompileRegistry
from trainer.core.runtime import Runtime
from trainer.model import attention, blocks
from trainer.core import step
from dfo_contract.exitcodes import TrainerConfigError

B = 8


def _case(b=2, s=200, n=20, seed=0, invalid=3):
    g = torch.Generator().manual_seed(seed)
    lm = torch.ones(b, s, dtype=torch.bool)
    lens = torch.tensor([s, s - 37][:b])
    lm[1, s - 37:] = False
    anchors, valid = blocks.sample_anchors(lm, lens, n, B, generator=g)
    valid[0, -invalid:] = False
    anchors[0, -invalid:] = 0
    return anchors, valid, s


@pytest.mark.parametrize("s,n", [(200, 20), (256, 16), (64, 8)])
def test_analytic_block_mask_equals_create_block_mask(s, n):
    anchors, valid, s = _case(s=s, n=n)
    ours = attention.flex_block_mask(anchors, valid, s, B)
    ref = attention.reference_block_mask(anchors, valid, s, B)
    assert torch.equal(ours.kv_num_blocks, ref.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
    for a, r, num in ((ours.kv_indices, ref.kv_indices, ref.kv_num_blocks),
                      (ours.full_kv_indices, ref.full_kv_indices, ref.full_kv_num_blocks)):
        for bi in range(a.shape[0]):
            for qb in range(a.shape[2]):
                k = int(num[bi, 0, qb])
                assert sorted(a[bi, 0, qb, :k].tolist()) == sorted(r[bi, 0, qb, :k].tolist())
    # the mask_mod, evaluated densely, is the visibility mask
    from torch.nn.attention.flex_attention import create_mask

    dense = create_mask(ours.mask_mod, anchors.shape[0], 1, n * B, s + n * B, device="cpu")[:, 0]
    assert torch.equal(dense, blocks.visibility_mask(anchors, valid, s, B))


def test_compiled_flex_forward_equals_sdpa():
    C = CompileRegistry()
    anchors, valid, s = _case(s=120, n=16)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 16 * B, 16, generator=g)
    k = torch.randn(2, 2, s + 16 * B, 16, generator=g)
    v = torch.randn(2, 2, s + 16 * B, 16, generator=g)
    with torch.no_grad():
        ref = attention.attend("sdpa", q, k, v, attention.build_mask("sdpa", anchors, valid, s, B))
        out = attention.attend("flex", q, k, v, attention.build_mask("flex", anchors, valid, s, B),
                               flex=C.flex_attention)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert (out[0, :, -3 * B:] == 0).all()  # invalid blocks: zeros, not NaN
    assert "flex_attention" in C.names()


def test_drafter_forward_flex_equals_sdpa(tmp_path):
    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "d.jsonl"), num=4)
    cfg = tiny_config(target, data, str(tmp_path / "run"))
    rt = Runtime.create()
    tgt, drafter = step.build_models(cfg, "cpu", rt=rt)
    batch = step.dummy_batch(cfg, 64, 8, 2, "cpu", seed=4)
    batch.anchor_valid[1, -2:] = False
    feats = step.target_features(tgt, batch, cfg)
    with torch.no_grad():
        drafter.attn_backend = "sdpa"
        l_sdpa, m_sdpa = step.drafter_loss(drafter, feats, batch, cfg, rt)
        drafter.attn_backend = "flex"
        l_flex, m_flex = step.drafter_loss(drafter, feats, batch, cfg, rt)
    torch.testing.assert_close(l_flex, l_sdpa, rtol=1e-4, atol=1e-5)
    assert torch.equal(m_flex["count_per_pos"], m_sdpa["count_per_pos"])


def test_flex_on_cpu_for_training_is_refused_and_flex_eager_warns(tmp_path):
    cfg = tiny_config("/nonexistent", "d.jsonl", str(tmp_path), **{"model.attention": "flex"})
    with pytest.raises(TrainerConfigError, match="--model.attention: flex has no backward on CPU"):
        step.resolve_backend(cfg, torch.device("cpu"))
    cfg.model.attention = "flex-eager"
    with pytest.raises(TrainerConfigError, match="--model.attention: flex-eager has no backward on CPU"):
        step.resolve_backend(cfg, torch.device("cpu"))
    anchors, valid, s = _case(s=64, n=4, invalid=1)
    q = torch.randn(2, 2, 4 * B, 8)
    k = torch.randn(2, 2, s + 4 * B, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attention.attend("flex-eager", q, k, k, attention.build_mask("flex-eager", anchors, valid, s, B))
    assert any("flex-eager" in str(w.message) for w in caught)
    ref = attention.attend("sdpa", q, k, k, attention.build_mask("sdpa", anchors, valid, s, B))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    once = attention.EagerFlex()  # the process's (Runtime.eager_flex): warns on its first call only
    m = attention.build_mask("flex-eager", anchors, valid, s, B)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(attention.attend("flex-eager", q, k, k, m, flex=once), ref,
                                       rtol=1e-4, atol=1e-5)
    assert sum("flex-eager" in str(w.message) for w in caught) == 1


def test_call_guard_wraps_compiled_calls():
    import contextlib

    seen = []
    C = CompileRegistry()

    @contextlib.contextmanager
    def guard(what):
        seen.append(what)
        yield

    C.set_call_guard(guard)
    try:
        assert C.call("toy_square", lambda x: x * x, torch.ones(3)).sum() == 3
    finally:
        C.set_call_guard(None)
    assert seen == ["toy_square"]
    assert step.shape_buckets(tiny_config("/t", "d", "/r", **{"data.seq_buckets": "[32,64]",
                                                              "data.anchor_buckets": "[4,8]"})) == \
        [(32, 4), (32, 8), (64, 4), (64, 8)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled flex backward needs CUDA")
def test_flex_and_sdpa_agree_forward_and_backward_gpu():
    from trainer.bench.drafter_step import check_agreement

    r = check_agreement("cuda:0")
    assert r["ok"], r

