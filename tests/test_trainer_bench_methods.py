"""``python -m trainer.bench --methods dflash,dflash2``: DFlash2's FLOP formula (a hand count on
a tiny shape, the sliding window's visible pairs against the mask, the matmul FLOPs torch counts
on a real step), and both methods measured side by side on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.bench.flops import drafter_flops, visible_pairs
from trainer.model import blocks
from trainer.model.dflash2 import DFlash2Spec
from trainer.model.drafter import DrafterSpec


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_dflash2_flops_by_hand_on_a_tiny_shape():
    """H 8, 2/1 heads of 4, I 16, 1 layer, 2 taps, V 10; B 4, conv taps 2, group 4 (G 2),
    rank 3, top-k 2, window 5; one sequence of 12 with anchors 2 and 6."""
    spec = DrafterSpec(hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, num_layers=1,
                       num_taps=2, vocab=10)
    d2 = DFlash2Spec(block_size=4, conv_kernel_size=2, conv_group_size=4, selector_rank=3,
                     selector_top_k=2)
    anchors, valid = torch.tensor([[2, 6]]), torch.tensor([[True, True]])
    # full: 4*(2+4) + 4*(6+4); window 5: context min(a, 4-k) per slot k; own block: all 4
    # slots (bidirectional), k+1 of them (causal)
    assert visible_pairs(anchors, valid, 4) == 64
    assert visible_pairs(anchors, valid, 4, 5) == (2 + 2 + 2 + 1) + (4 + 3 + 2 + 1) + 2 * 16 == 49
    assert visible_pairs(anchors, valid, 4, 5, causal=True) == (2 + 2 + 2 + 1) + (4 + 3 + 2 + 1) + 2 * 10 == 37
    f = drafter_flops(spec, seq_len=12, tq=8, pairs=37, label_rows=6, d2=d2)
    fc = 4 * 12 * 16 * 8                                                   # 6144
    lin = 6 * (8 * 8 * 8 + 2 * 20 * 8 * 4 + 8 * 8 * 8 + 3 * 8 * 8 * 16)    # 32256
    attn = 3 * 4 * 2 * 4 * 37                                              # 3552
    head = 4 * 6 * 8 * 10                                                  # 1920
    conv = 2 * (6 * 8 * 8 * (2 * 2 * 2) + 3 * 2 * (2 * 2 * 8 * 8))         # 2 sublayers: 9216
    sel = 6 * (4 * 2 * 8 + 6 * 8 * 3 + 3 * 3 + 3 * 2 * 2 * 3)             # 1518
    assert (f["fc"], f["layers"], f["attention"], f["lm_head"]) == (fc, lin + attn, attn, head)
    assert (f["conv"], f["selector"]) == (conv, sel)
    assert f["total"] == fc + lin + attn + head + conv + sel == 54606
    plain = drafter_flops(spec, seq_len=12, tq=8, pairs=64, label_rows=6)
    assert "conv" not in plain and plain["total"] == fc + lin + 3 * 4 * 2 * 4 * 64 + head


def test_window_pairs_count_the_visibility_mask():
    g = torch.Generator().manual_seed(3)
    anchors, valid = blocks.sample_anchors(torch.ones(3, 90, dtype=torch.bool),
                                           torch.tensor([90, 60, 10]), 12, 8, generator=g)
    assert not bool(valid.all())                     # some invalid blocks (the short row)
    for window in (0, 8, 13, 40, 200):
        for causal in (False, True):
            vis = blocks.visibility_mask(anchors, valid, 90, 8, window, causal)
            assert visible_pairs(anchors, valid, 8, window, causal) == int(vis.sum()), window


def test_matmul_flops_match_torch_flop_counter_on_a_real_step():
    """torch's FlopCounterMode counts the matmuls of a real CPU step (not the CPU sdpa kernel,
    nor elementwise work): the formula less attention, the depthwise multiply-adds and the
    codebook product equals its count, for DFlash and DFlash2."""
    from torch.utils.flop_counter import FlopCounterMode

    from dfo_contract.trainer_config import TrainerConfig
    from trainer.bench.methods import step_flops
    from trainer.model.target import target_from_config, tiny_qwen3_config
    from trainer.core import step as S

    target = target_from_config(tiny_qwen3_config(hidden=64, layers=4, vocab=128),
                                device=torch.device("cpu"), dtype=torch.float32,
                                num_drafter_layers=2, tap_ids=[1, 2])
    for method in ("dflash", "dflash2"):
        cfg = TrainerConfig()
        cfg.model.drafter_layers, cfg.model.block_size, cfg.model.mask_token_id = 2, 8, 3
        cfg.data.path, cfg.data.max_seq_len, cfg.data.num_anchors = "x", 64, 8
        cfg.compile.enabled, cfg.compile.gate, cfg.model.attention = False, False, "sdpa"
        cfg.model.method, cfg.model.sliding_window = method, 24
        cfg.model.set_flat("selector_rank", 8)
        cfg.model.set_flat("selector_top_k", 4)
        _, drafter = S.build_models(cfg, "cpu", target=target)
        batch = S.dummy_batch(cfg, 64, 8, 2, "cpu", seed=0)
        feats = S.target_features(target, batch, cfg)
        with FlopCounterMode(display=False) as fc:
            loss, _ = S.drafter_loss(drafter, feats, batch, cfg)
            loss.backward()
        f, _ = step_flops(cfg, drafter.spec, batch, 64)
        # tq 2*8*8 = 128 rows, R = 2*8*7 = 112 label rows, H 64, conv taps 2, rank 8
        elementwise = 2 * 2 * 3 * 2 * (2 * 2 * 128 * 64) + 3 * 8 * 112 if method == "dflash2" else 0
        assert fc.get_total_flops() == f["total"] - f["attention"] - elementwise, method


def test_bench_measures_both_methods_side_by_side_on_cpu(tmp_path, capsys):
    from trainer.bench import drafter_step as bench

    out = tmp_path / "m.json"
    assert bench.main(["--quick", "--cpu", "--methods", "dflash,dflash2", "--variants", "sdpa",
                       "--iters", "1", "--warmup", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    one, two = r["methods"]["dflash"], r["methods"]["dflash2"]
    assert two["config"]["sliding_window"] == 32
    assert two["visible_pairs"] < one["visible_pairs"]          # the window cuts the context
    assert two["flops"]["conv"] > 0 and two["flops"]["selector"] > 0
    assert two["flops"]["total"] > one["flops"]["total"]
    for m in (one, two):
        assert m["variants"]["sdpa"]["drafter_step_ms"] > 0
        assert m["variants"]["sdpa"]["drafter_flops"] == m["flops"]["total"]
    q = r["ratio"]["sdpa"]
    assert q["flops"] == round(two["flops"]["total"] / one["flops"]["total"], 4)
    assert q["step_time"] == round(two["variants"]["sdpa"]["drafter_step_ms"]
                                   / one["variants"]["sdpa"]["drafter_step_ms"], 4)
    assert r["variants"] == one["variants"]                     # the one-method keys: the first's
    text = capsys.readouterr().out
    assert "bench: dflash2 sdpa:" in text and "| dflash2 | sdpa |" in text
    assert "DFlash2 / DFlash at the same shape" in text
    assert bench.main(["--quick", "--cpu", "--methods", "dflash,dflash3"]) == 2
    assert "unknown --methods entry 'dflash3'" in capsys.readouterr().err
