"""Packed rows (data.pack) are exact: each sample in a packed row gives the target features,
the loss and the drafter gradients it gives alone, for DFlash and DFlash2 and every
attention pattern (CPU, fp32); the packer is deterministic, resumes bit-identically and
fills rows of one shape."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

from dfo_contract.exitcodes import TrainerConfigError
from tests.helpers.trainer import make_synth, make_target, tiny_config
from trainer.data.batch import Batch
from trainer.data.formats import Sample
from trainer.data.pack import RowShape, anchor_need, pack_rows, plan_rows
from trainer.model import attention, blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

B = 8
# the four attention patterns dfo exports, on a 2-layer drafter (window 8: it cuts context)
PATTERNS = {
    "full": {"model.layer_types": "[full_attention,full_attention]", "model.is_causal": "false"},
    "sliding": {"model.layer_types": "[sliding_attention,sliding_attention]",
                "model.sliding_window": 8, "model.is_causal": "false"},
    "causal": {"model.layer_types": "[full_attention,full_attention]", "model.is_causal": "true"},
    "hybrid": {"model.layer_types": "[sliding_attention,full_attention]",
               "model.sliding_window": 8, "model.is_causal": "null"},
}
METHODS = {"dflash": {},
           "dflash2": {"model.method": "dflash2", "model.selector_rank": 8,
                       "model.selector_top_k": 4}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    return {"dir": d, "target": make_target(str(d / "target")),
            "data": make_synth(str(d / "synth.jsonl"), num=40)}


def _docs(seed=0, lengths=(37, 52, 23)) -> list[Sample]:
    """Samples with a prompt (no loss) then a reply (loss), random tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(4, 120, (n,), generator=g).tolist()
        prompt = int(torch.randint(2, n // 3, (1,), generator=g))
        out.append(Sample(ids, [0] * prompt + [1] * (n - prompt)))
    return out


def _alone(doc: Sample, anchors: torch.Tensor) -> Batch:
    """``doc`` as a bucketed batch of one row with the given anchors."""
    n = len(doc.input_ids)
    return Batch(input_ids=torch.tensor([doc.input_ids]), loss_mask=torch.tensor([doc.loss_mask]).bool(),
                 lengths=torch.tensor([n]), anchors=anchors.view(1, -1),
                 anchor_valid=torch.ones(1, anchors.numel(), dtype=torch.bool), num_tokens=n,
                 num_samples=1)


def _bucketed(docs: list[Sample], per_doc: list[torch.Tensor]) -> Batch:
    """Every doc a row of one batch padded to the longest, with the given anchors."""
    s = max(len(d.input_ids) for d in docs)
    n = max(a.numel() for a in per_doc)
    ids = torch.zeros(len(docs), s, dtype=torch.long)
    lm = torch.zeros(len(docs), s, dtype=torch.bool)
    anchors = torch.zeros(len(docs), n, dtype=torch.long)
    valid = torch.zeros(len(docs), n, dtype=torch.bool)
    for i, (d, a) in enumerate(zip(docs, per_doc, strict=True)):
        ids[i, :len(d.input_ids)] = torch.tensor(d.input_ids)
        lm[i, :len(d.loss_mask)] = torch.tensor(d.loss_mask).bool()
        anchors[i, :a.numel()] = a
        valid[i, :a.numel()] = True
    lens = torch.tensor([len(d.input_ids) for d in docs])
    return Batch(input_ids=ids, loss_mask=lm, lengths=lens, anchors=anchors, anchor_valid=valid,
                 num_tokens=int(lens.sum()), num_samples=len(docs))


def _only(packed: Batch, lo: int) -> Batch:
    """``packed`` with only the anchors of the sample starting at ``lo`` valid."""
    keep = packed.anchor_valid & (packed.doc_lo == lo)
    return Batch(**{**packed.__dict__, "anchor_valid": keep})


def _loss_and_grads(target, drafter, cfg, batch):
    from trainer.core import step

    drafter.zero_grad(set_to_none=True)
    feats = step.target_features(target, batch, cfg)
    loss, _m = step.drafter_loss(drafter, feats, batch, cfg)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in drafter.named_parameters()
             if p.grad is not None}
    return feats, loss.detach(), grads


def _close(a: dict, b: dict, what: str):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-5), \
            f"{what}: {k} differs by {(a[k] - b[k]).abs().max():.3g}"


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_packed_row_equals_each_sample_alone(env, method, pattern):
    from trainer.core.step import build_models

    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / "m"),
                      **{"model.drafter_layers": 2, "model.target_layer_ids": "[1,2]",
                         "model.dtype": "fp32", "data.num_anchors": 6, "data.pack": "true",
                         "data.pack_tokens": 128, "data.pack_anchors": 20,
                         **METHODS[method], **PATTERNS[pattern]})
    target, drafter = build_models(cfg, "cpu")
    if method == "dflash2":  # away from the no-op start: convs and selector take part
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for n, p in drafter.named_parameters():
                if "conv" in n or "codebook" in n:
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
    docs = _docs()
    packed = pack_rows([docs], shape=RowShape(128, 20), block_size=B, num_anchors=6, seed=3,
                       micro_index=0)
    assert packed.num_samples == 3 and packed.num_tokens == 112 and packed.padding == 16
    feats_p, loss_p, grads_p = _loss_and_grads(target, drafter, cfg, packed)
    per_doc = []
    for d in docs:
        lo = int(packed.doc_lo[packed.anchor_valid & (packed.doc_lo == _start(docs, d))][0])
        n = len(d.input_ids)
        mine = packed.anchor_valid[0] & (packed.doc_lo[0] == lo)
        a = packed.anchors[0, mine] - lo
        assert a.numel() == anchor_need(d.loss_mask, 6)
        per_doc.append(a)
        feats_a, loss_a, grads_a = _loss_and_grads(target, drafter, cfg, _alone(d, a))
        assert torch.allclose(feats_p[0, lo:lo + n], feats_a[0], atol=1e-5, rtol=1e-5)
        _f, loss_o, grads_o = _loss_and_grads(target, drafter, cfg, _only(packed, lo))
        assert torch.allclose(loss_o, loss_a, atol=1e-5, rtol=1e-5), (loss_o, loss_a)
        _close(grads_o, grads_a, f"sample at {lo}")
    # the whole row against the bucketed batch of the same samples and anchors
    _f, loss_b, grads_b = _loss_and_grads(target, drafter, cfg, _bucketed(docs, per_doc))
    assert torch.allclose(loss_p, loss_b, atol=1e-5, rtol=1e-5), (loss_p, loss_b)
    _close(grads_p, grads_b, "the row")


def _start(docs, d) -> int:
    at = 0
    for x in docs:
        if x is d:
            return at
        at += len(x.input_ids)
    raise AssertionError


@pytest.mark.parametrize("window,causal", [(0, False), (8, False), (0, True), (5, True)])
def test_packed_flex_block_mask_equals_create_block_mask(window, causal):
    packed = pack_rows([_docs(1), _docs(2, (60, 30))], shape=RowShape(128, 24), block_size=B,
                       num_anchors=6, seed=0, micro_index=0)
    a, v, lo = packed.anchors, packed.anchor_valid, packed.doc_lo
    ours = attention.flex_block_mask(a, v, 128, B, window=window, causal=causal, ctx_lo=lo)
    ref = attention.reference_block_mask(a, v, 128, B, window=window, causal=causal, ctx_lo=lo)
    assert torch.equal(ours.kv_num_blocks, ref.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
    from torch.nn.attention.flex_attention import create_mask

    dense = create_mask(ours.mask_mod, 2, 1, 24 * B, 128 + 24 * B, device="cpu")[:, 0]
    vis = blocks.visibility_mask(a, v, 128, B, window, causal, ctx_lo=lo)
    assert torch.equal(dense, vis)
    # no block sees another sample's context
    kv = torch.arange(128)
    for r in range(2):
        for q in range(24 * B):
            n = q // B
            if v[r, n]:
                seen = kv[vis[r, q, :128]]
                assert seen.numel() == 0 or (int(seen.min()) >= int(lo[r, n])
                                             and int(seen.max()) < int(a[r, n]))


def test_plan_rows_is_greedy_in_order_and_respects_both_budgets():
    rows, taken = plan_rows(iter([(50, 4), (50, 4), (30, 9), (10, 1), (90, 2), (5, 1)]), 2,
                            RowShape(100, 10))
    assert rows == [[0, 1], [2, 3]] and taken == 4
    rows, taken = plan_rows(iter([(10, 1)]), 3, RowShape(100, 10))
    assert rows == [[0], [], []] and taken == 1
    with pytest.raises(Exception, match="does not fit a packed row"):
        plan_rows(iter([(101, 1)]), 1, RowShape(100, 10))


def _stream(env, **kw):
    from trainer.data.datasets import open_dataset
    from trainer.data.stream import stream_for

    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / "s"),
                      **{"data.pack": "true", "data.pack_tokens": 160, "data.pack_anchors": 24,
                         "train.micro_batch": 2, **kw})
    ds = open_dataset(cfg.data.path, vocab_size=128, block_size=B, max_seq_len=64,
                      min_loss_tokens=cfg.min_loss_tokens(), fmt="auto", tokenizer=None,
                      mask_token_id=3)
    return stream_for(ds, cfg)


def test_packed_stream_one_shape_resume_and_skip_agree(env):
    s = _stream(env)
    first = [s.next() for _ in range(12)]
    assert {b.shape for b in first} == {(160, 24)}
    assert all(b.input_ids.shape[0] == 2 for b in first)
    # every sample of the epoch once, in order, none split
    assert sum(b.num_samples for b in first) >= 40
    # resume from a state mid-way: the same micro-batches, bit for bit
    s2 = _stream(env)
    for _ in range(5):
        s2.next()
    st = json.loads(json.dumps(s2.state_dict()))
    s3 = _stream(env)
    s3.load_state_dict(st)
    for want in first[5:]:
        got = s3.next()
        for f in ("input_ids", "loss_mask", "anchors", "anchor_valid", "position_ids", "doc_lo",
                  "doc_hi"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
    # ddp: skipping counts what building would, and lands on the same next micro-batch
    s4 = _stream(env)
    mixed = s4.take(4, keep=[1, 3])
    assert [m.num_tokens for m in mixed] == [b.num_tokens for b in first[:4]]
    assert [m.num_samples for m in mixed] == [b.num_samples for b in first[:4]]
    assert torch.equal(s4.next().input_ids, first[4].input_ids)


def test_packed_state_refused_by_a_bucketed_run(env):
    s = _stream(env)
    s.next()
    b = _stream(env, **{"data.pack": "false"})
    with pytest.raises(TrainerConfigError, match="packed rows"):
        b.load_state_dict(s.state_dict())


def test_pack_settings_are_checked(env):
    with pytest.raises(TrainerConfigError, match="data.pack_tokens"):
        tiny_config(env["target"], env["data"], "r", **{"data.pack_tokens": 32})
    with pytest.raises(TrainerConfigError, match="data.pack_anchors"):
        tiny_config(env["target"], env["data"], "r", **{"data.pack_anchors": 4})
    cfg = tiny_config(env["target"], env["data"], "r", **{"data.pack": "true"})
    assert cfg.pack_row() == (64, 8)
    from trainer.core.step import shape_buckets

    assert shape_buckets(cfg) == [(64, 8)]


def test_packed_training_resumes_exactly(env):
    """A packed run stopped at step 3 and resumed gives the uninterrupted run's losses."""
    from trainer.train.loop import train

    kw = {"data.pack": "true", "data.pack_tokens": 128, "data.pack_anchors": 16,
          "train.micro_batch": 2, "train.max_steps": 6, "train.schedule_steps": 6,
          "checkpoint.every": 3}
    whole = tiny_config(env["target"], env["data"], str(env["dir"] / "whole"), **kw)
    assert train(whole, out=io.StringIO()) == 0
    part = tiny_config(env["target"], env["data"], str(env["dir"] / "part"),
                       **{**kw, "train.max_steps": 3})
    assert train(part, out=io.StringIO()) == 0
    rest = tiny_config(env["target"], env["data"], str(env["dir"] / "part"), **kw)
    assert train(rest, resume="latest", out=io.StringIO()) == 0

    def losses(d):
        with open(os.path.join(d, "metrics.jsonl")) as f:
            return {r["step"]: r["loss"] for r in map(json.loads, f)}
    a, b = losses(str(env["dir"] / "whole")), losses(str(env["dir"] / "part"))
    assert [a[k] for k in range(1, 7)] == [b[k] for k in range(1, 7)]


@pytest.mark.parametrize("packed", [True, False])
def test_compiles_once_for_every_length_when_packed(env, tmp_path, monkeypatch, packed):
    """With compile on (the drafter step and the target's layers, the gate sealed after its
    warm-up), training on samples of 20 to 96 tokens: packed, dynamo compiles one graph of each
    (torch's own counter), bucketed one per sequence bucket. Dynamo's tracing, guards and
    recompiles are inductor's; aot_eager only skips the code generation."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from trainer.compile.registry import CompileRegistry
    from trainer.data.synth import synth_samples
    from trainer.train.loop import train

    data = tmp_path / "var.jsonl"
    # a row holding one sample that fills it (no boundary in it) is in the stream too
    full = {"input_ids": list(range(4, 100)), "loss_mask": [0] * 10 + [1] * 86}
    data.write_text("".join(json.dumps(s) + "\n"
                            for s in [full, *synth_samples(40, 96, 128, 0, min_len=20), full]))
    monkeypatch.setattr(CompileRegistry, "backend", "aot_eager")
    kw = {"compile.enabled": "true", "compile.gate": "true", "compile.target": "true",
          "data.max_seq_len": 96, "train.micro_batch": 2, "train.max_steps": 8}
    kw.update({"data.pack": "true", "data.pack_tokens": 96, "data.pack_anchors": 16,
               "train.micro_batch": 1, "data.shuffle": "false"} if packed
              else {"data.seq_buckets": "[32,64,96]"})
    cfg = tiny_config(env["target"], str(data), str(tmp_path / "run"), **kw)
    torch._dynamo.reset()
    counters.clear()
    out = io.StringIO()
    assert train(cfg, out=out) == 0, out.getvalue()[-2000:]
    graphs = counters["stats"]["unique_graphs"]
    # one drafter step and one target layer function per shape (the gate fails the run on
    # any compile after its warm-up, so these are all the run compiled)
    assert graphs == (2 if packed else 6), (graphs, out.getvalue()[-2000:])
    torch._dynamo.reset()
