"""The draft layers' attention as data: the config's pattern, the masks built from it (sdpa,
flex, the flop count) against a definition from positions alone, and what the export's fields
make each engine serve."""

from __future__ import annotations

import pytest
import torch

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import load_config
from dfo_contract.trainer_config.layers import SLIDING, LayerAttention, layer_pattern
from trainer.bench.flops import visible_pairs
from trainer.evaluate.served import (ENGINES, Unservable, check_served, export_fields,
                                     parse_engines, served_pattern)
from trainer.model import attention, blocks

BID, CAUSAL = False, True


def _cfg(*flags):
    return load_config(None, ["--data.path", "x", "--model.block_size", "8", *flags])


def test_defaults_dflash_full_dflash2_sliding_both_bidirectional():
    assert layer_pattern(_cfg().model) == (LayerAttention(0, BID),) * 5
    assert layer_pattern(_cfg("--model.method", "dflash2").model) == (LayerAttention(2048, BID),) * 5
    assert layer_pattern(_cfg("--model.method", "dflash2", "--model.sliding_window", "0").model) \
        == (LayerAttention(0, BID),) * 5


def test_hybrid_and_legacy_causality():
    m = _cfg("--model.drafter_layers", "3", "--model.layer_types",
             "[sliding_attention, sliding_attention, full_attention]", "--model.sliding_window", "16",
             "--model.is_causal", "null").model
    assert layer_pattern(m) == (LayerAttention(16, CAUSAL), LayerAttention(16, CAUSAL),
                                LayerAttention(0, BID))
    m.is_causal = True
    assert [la.causal for la in layer_pattern(m)] == [True] * 3


@pytest.mark.parametrize("flags,msg", [
    (["--model.layer_types", "[full_attention]"], "--model.layer_types: 1 entries for model.drafter_layers=5"),
    (["--model.drafter_layers", "1", "--model.layer_types", "[chunked_attention]"],
     "--model.layer_types: 'chunked_attention' is not a layer type dfo trains"),
    (["--model.drafter_layers", "1", "--model.layer_types", "[sliding_attention]",
      "--model.sliding_window", "0"], "--model.sliding_window: 0 \\(no window\\)"),
    (["--model.drafter_layers", "1", "--model.layer_types", "[sliding_attention]",
      "--model.sliding_window", "4"], "--model.sliding_window: must be 0 or >= model.block_size"),
    (["--model.is_causal", "maybe"], "--model.is_causal"),
])
def test_config_errors_name_the_flag(flags, msg):
    with pytest.raises(TrainerConfigError, match=msg):
        _cfg(*flags)


def _by_positions(anchors, valid, seq_len, bs, window, causal):
    """The visibility from positions alone: query p = a+k sees context j < a (sliding:
    p - j < window) and block slot k' (position a+k') when |p - (a+k')| < window (a
    symmetric window, or any for a full layer) and, causal, k' <= k."""
    b, n = anchors.shape
    out = torch.zeros(b, n * bs, seq_len + n * bs, dtype=torch.bool)
    for i in range(b):
        for blk in range(n):
            if not valid[i, blk]:
                continue
            a = int(anchors[i, blk])
            for k in range(bs):
                p = a + k
                for j in range(min(a, seq_len)):
                    out[i, blk * bs + k, j] = not window or p - j < window
                for k2 in range(bs):
                    near = not window or abs(k - k2) < window
                    out[i, blk * bs + k, seq_len + blk * bs + k2] = near and (not causal or k2 <= k)
    return out


@pytest.mark.parametrize("window", [0, 12, 100])
@pytest.mark.parametrize("causal", [BID, CAUSAL])
def test_masks_equal_the_definition_from_positions(window, causal):
    g = torch.Generator().manual_seed(3)
    seq_len, bs = 40, 8
    anchors, valid = blocks.sample_anchors(torch.ones(2, seq_len, dtype=torch.bool),
                                           torch.tensor([seq_len, 25]), 5, bs, generator=g)
    want = _by_positions(anchors, valid, seq_len, bs, window, causal)
    assert torch.equal(blocks.visibility_mask(anchors, valid, seq_len, bs, window, causal), want)
    assert visible_pairs(anchors, valid, bs, window, causal) == int(want.sum())
    ours = attention.flex_block_mask(anchors, valid, seq_len, bs, block=16, window=window,
                                     causal=causal).to_dense()
    ref = attention.reference_block_mask(anchors, valid, seq_len, bs, block=16, window=window,
                                         causal=causal).to_dense()
    assert torch.equal(ours, ref)


def test_build_masks_shares_one_mask_per_pattern():
    anchors, valid = torch.tensor([[3, 20]]), torch.tensor([[True, True]])
    pat = (LayerAttention(16, BID), LayerAttention(16, BID), LayerAttention(0, BID))
    masks = attention.build_masks("sdpa", anchors, valid, 32, 8, pat)
    assert masks[0] is masks[1] and masks[1] is not masks[2]


def _conf(pattern, **fields):
    return {"num_hidden_layers": len(pattern), **export_fields(pattern), **fields}


@pytest.mark.parametrize("pattern", [
    (LayerAttention(0, BID),) * 2,                               # DFlash
    (LayerAttention(2048, BID),) * 3,                            # DFlash2's default
    (LayerAttention(64, BID), LayerAttention(0, BID)),           # hybrid, bidirectional
])
def test_every_engine_serves_a_uniform_pattern_as_trained(pattern):
    conf = _conf(pattern)
    assert isinstance(conf["is_causal"], bool)
    assert conf["dflash_config"] == {"causal": conf["is_causal"]}
    for engine in ENGINES:
        assert served_pattern(conf, engine) == pattern
    check_served(pattern, conf)


@pytest.mark.parametrize("pattern", [
    (LayerAttention(64, CAUSAL),) * 2,                           # causal sliding everywhere
    (LayerAttention(0, CAUSAL),) * 2,                            # causal full everywhere
])
def test_a_causal_pattern_is_served_as_trained_by_every_engine_but_llama_cpp(pattern):
    conf = _conf(pattern)
    assert conf["is_causal"] is True and conf["dflash_config"] == {"causal": True}
    for engine in ENGINES:
        if engine != "llama.cpp":
            assert served_pattern(conf, engine) == pattern, engine
    # llama.cpp's converter writes `attention.causal` only for false: it runs them bidirectional
    assert all(not la.causal for la in served_pattern(conf, "llama.cpp"))
    with pytest.raises(Unservable, match="llama.cpp serves layer 0 as .*bidirectional within "
                                         "the block, but it was trained .*causal"):
        check_served(pattern, conf)
    check_served(pattern, conf, parse_engines("z-lab,vllm,vllm-0.27,sglang,lmdeploy"))


def test_readers_of_dflash_config_causal_ignore_is_causal():
    """vLLM before 0.28 and LMDeploy read `dflash_config.causal`, not `is_causal`: without
    the key they apply the legacy rule; an export writes it, so they serve it as trained."""
    pat = (LayerAttention(64, BID),) * 2
    bare = {"num_hidden_layers": 2, "layer_types": [SLIDING] * 2, "sliding_window": 64,
            "use_sliding_window": True, "is_causal": False}
    for engine in ("vllm-0.27", "lmdeploy"):
        assert served_pattern(bare, engine) == (LayerAttention(64, CAUSAL),) * 2
        assert served_pattern({**bare, "dflash_config": {"causal": False}}, engine) == pat
    assert served_pattern(bare, "vllm") == pat        # 0.28+: is_causal wins
    with pytest.raises(Unservable, match="vllm-0.27 serves layer 0 as sliding window 64, causal"):
        check_served(pat, bare)


def test_legacy_hybrid_is_refused_for_llama_cpp_only():
    pat = (LayerAttention(2048, CAUSAL),) * 4 + (LayerAttention(0, BID),)   # Qwen3.6-27B DFlash
    conf = _conf(pat)
    assert "is_causal" not in conf
    for engine in ("z-lab", "vllm", "sglang"):
        assert served_pattern(conf, engine) == pat
    with pytest.raises(Unservable, match="llama.cpp serves layer 0 as sliding window 2048, "
                                         "bidirectional within the block, but it was trained "
                                         "sliding window 2048, causal within the block"):
        check_served(pat, conf)
    check_served(pat, conf, parse_engines("z-lab,vllm,sglang"))


def test_a_causal_full_layer_beside_a_bidirectional_sliding_one_has_no_config():
    pat = (LayerAttention(32, BID), LayerAttention(0, CAUSAL))
    with pytest.raises(Unservable, match="z-lab serves layer 0 as sliding window 32, causal"):
        check_served(pat, _conf(pat))


def test_vllm_reads_dflash_config_causal_when_is_causal_is_absent():
    conf = {"num_hidden_layers": 1, "layer_types": ["full_attention"],
            "dflash_config": {"causal": True}}
    assert served_pattern(conf, "vllm") == (LayerAttention(0, CAUSAL),)
    assert served_pattern(conf, "z-lab") == (LayerAttention(0, BID),)


def test_engines_flag():
    assert parse_engines("all") == ENGINES
    assert parse_engines("vllm, sglang") == ("vllm", "sglang")
    with pytest.raises(ValueError, match="unknown engine 'trtllm'"):
        parse_engines("vllm,trtllm")
    with pytest.raises(Unservable, match="one sliding_window"):
        export_fields((LayerAttention(16, BID), LayerAttention(32, BID)))


def test_z_lab_drops_a_window_without_use_sliding_window():
    """transformers' Qwen3Config keeps sliding_window only with use_sliding_window: true, so
    z-lab's class runs such sliding layers without a window; vLLM keeps it."""
    conf = {"num_hidden_layers": 1, "layer_types": [SLIDING], "sliding_window": 64}
    assert served_pattern(conf, "z-lab") == (LayerAttention(0, CAUSAL),)
    assert served_pattern(conf, "vllm") == (LayerAttention(64, CAUSAL),)
    assert served_pattern({**conf, "use_sliding_window": True}, "z-lab") == \
        (LayerAttention(64, CAUSAL),)
