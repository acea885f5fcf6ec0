"""dfo's exports as z-lab's own model classes run them (``dflash`` 0.1.0 from PyPI, z-lab's
``dflash/model.py``: ``DFlashDraftModel``, ``DFlash2DraftModel`` and its ``dflash_generate``
loop; installed by scripts/test.sh from tests/env/reference.txt, never copied here).

For each attention pattern dfo trains (full and sliding layers, bidirectional and causal
within the block, a hybrid), a drafter is trained a few steps by the real trainer, exported,
and loaded by z-lab's class from the export directory alone. Then

- z-lab's forward equals dfo's, both the exported drafter's and the training-time forward
  (the checkpoint with the training masks), to fp32 rounding;
- z-lab's own greedy generation gives the tokens and, block by block, the acceptance lengths
  of ``trainer eval --spec-decode`` (``spec_eval.speculative``).

Released-style drafters (4 sliding + 1 full layers without ``is_causal``; causal sliding
layers) go through ``model.init_from`` -> 3 steps -> export and load with the same pattern.
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from tests.helpers.trainer import make_target, tiny_config

zlab = pytest.importorskip("dflash.model", reason="z-lab's dflash 0.1.0 (tests/env/reference.txt)")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = {"model.drafter_layers": 2, "model.target_layer_ids": "[1,2]", "train.lr": 1e-2,
        "train.max_steps": 80, "checkpoint.every": 0, "data.num_anchors": 16}
D2 = {"model.method": "dflash2", "model.selector_rank": 8, "model.selector_top_k": 4}
#: name -> (config overrides, engines the export is held to)
PATTERNS = {
    "dflash": ({}, "all"),
    # causal drafters: llama.cpp runs them bidirectional (docs/trainer.md), the rest as trained
    "dflash-hybrid-causal": ({"model.layer_types": "[sliding_attention,full_attention]",
                              "model.sliding_window": 12, "model.is_causal": "true"},
                             "z-lab,vllm,vllm-0.27,sglang,lmdeploy"),
    "dflash2": ({**D2, "model.sliding_window": 12}, "all"),
    "dflash2-causal": ({**D2, "model.sliding_window": 12, "model.is_causal": "true"},
                       "z-lab,vllm,vllm-0.27,sglang,lmdeploy"),
    "dflash2-legacy-hybrid": ({**D2, "model.layer_types": "[sliding_attention,full_attention]",
                               "model.sliding_window": 12, "model.is_causal": "null"},
                              "z-lab,vllm,sglang"),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny target taught stride sequences and data it generated: drafters trained on it
    for 80 steps accept several tokens a block, so the decoding comparison has something
    to compare."""
    from trainer.data.tinylm import regenerate, teach

    d = tmp_path_factory.mktemp("zlab")
    target = make_target(str(d / "target"))
    torch.set_num_threads(1)
    teach(target, steps=150, seq_len=40)
    return {"dir": d, "target": target,
            "data": regenerate(target, str(d / "train.jsonl"), num=64, new=36, seed=1)}


def _train(env, name, extra, resume=None, steps=None):
    from trainer.train.loop import train

    kw = {**BASE, **extra}
    if steps:
        kw["train.max_steps"] = steps
    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / name), **kw)
    assert train(cfg, resume=resume, out=io.StringIO()) == 0
    return cfg, env["dir"] / name / "checkpoints" / f"step_{kw['train.max_steps']}"


def _export(ckpt, out, engines="all"):
    from trainer.evaluate.export_dir import export

    export(str(ckpt), str(out), dtype="fp32", engines=engines)
    return json.loads((out / "config.json").read_text())


def _zlab_model(conf, out):
    cls = zlab.DFlash2DraftModel if conf["architectures"] == ["DFlash2DraftModel"] \
        else zlab.DFlashDraftModel
    return cls.from_pretrained(str(out), dtype=torch.float32, attn_implementation="sdpa").eval()


def _target(env):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(env["target"], local_files_only=True,
                                                dtype=torch.float32).eval()


def _inputs(model, dr, prompt, start):
    """(context features, block ids, block positions) of the block anchored at ``start``."""
    from trainer.evaluate import spec_eval

    taps = spec_eval.Tapped(model, dr.target_layer_ids)
    _, feats = taps.forward(torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0), None)
    block = torch.full((1, dr.block_size), dr.mask_token_id)
    block[0, 0] = prompt[start]
    return feats[:, :start], block, torch.arange(start, start + dr.block_size).unsqueeze(0)


def _dfo_forward(drafter, pattern, ctx, block, pos):
    from trainer.model import attention

    start = pos.shape[1] and int(pos[0, 0])
    masks = attention.build_masks("sdpa", torch.tensor([[start]]), torch.ones(1, 1, dtype=torch.bool),
                                  ctx.shape[1], block.shape[1], pattern)
    with torch.no_grad():
        return drafter(ctx, block, pos, attention.layer_attends("sdpa", masks))


def _zlab_forward(zm, model, ctx, block):
    with torch.no_grad():
        return zm(position_ids=torch.arange(ctx.shape[1] + block.shape[1]).unsqueeze(0),
                  target_hidden=ctx, noise_embedding=model.get_input_embeddings()(block))


def _zlab_generate(zm, model, prompt, n_new, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # its timer, on the CPU
    res = zlab.dflash_generate(zm, model, torch.tensor([prompt]), max_new_tokens=n_new,
                               stop_token_ids=None, return_stats=True)
    return res.output_ids[0, len(prompt):].tolist(), list(res.acceptance_lengths)


PROMPTS = ([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
           [40, 3, 77, 41, 90, 12, 45, 47, 49, 51, 53], [20, 23, 26, 29])


@pytest.mark.parametrize("name", list(PATTERNS))
def test_zlab_class_serves_the_export_as_dfo_trained_and_decodes_it(env, name, tmp_path, monkeypatch):
    from dfo_contract.trainer_config.layers import layer_pattern
    from trainer.evaluate import spec_eval
    from trainer.evaluate.export_dir import load_exported
    from trainer.core import checkpoints
    from trainer.core.step import build_models

    extra, engines = PATTERNS[name]
    cfg, ckpt = _train(env, name, extra)
    conf = _export(ckpt, tmp_path / "x", engines)
    model = _target(env)
    zm = _zlab_model(conf, tmp_path / "x")
    dr = load_exported(str(tmp_path / "x"), embed_tokens=model.get_input_embeddings(),
                       lm_head=model.get_output_embeddings()).eval()
    assert dr.spec.pattern == layer_pattern(cfg.model)
    assert [(layer.self_attn.sliding_window or 0, layer.self_attn.is_causal) for layer in zm.layers] \
        == [(la.window, la.causal) for la in layer_pattern(cfg.model)]
    # the training-time drafter, with the masks it was trained with
    _, trained = build_models(cfg, "cpu")
    checkpoints.load(str(ckpt), drafter=trained, restore_rng=False)
    trained.eval()
    for prompt in PROMPTS:
        for start in (3, len(prompt) - 1):        # a short context, and one the window cuts
            ctx, block, pos = _inputs(model, dr, prompt, start)
            z = _zlab_forward(zm, model, ctx, block)
            torch.testing.assert_close(_dfo_forward(dr, dr.spec.pattern, ctx, block, pos), z,
                                       rtol=0, atol=2e-5)
            torch.testing.assert_close(_dfo_forward(trained, layer_pattern(cfg.model), ctx, block, pos),
                                       z, rtol=0, atol=2e-5)
            if any(la.causal for la in dr.spec.pattern) and start > 3:
                # the same weights read bidirectionally are another drafter: the masks matter
                bi = [type(la)(la.window, False) for la in dr.spec.pattern]
                assert not torch.allclose(_dfo_forward(dr, bi, ctx, block, pos), z, atol=1e-4)
    if "auto_map" in conf:     # DFlash ships its own module: transformers' trust_remote_code
        _shipped_module_serves_the_pattern(tmp_path / "x", model, dr, zm)
    target = spec_eval.Tapped(model, dr.target_layer_ids)
    accepted: list[int] = []
    for prompt in PROMPTS:
        n_new = 40
        z_tokens, z_acc = _zlab_generate(zm, model, prompt, n_new, monkeypatch)
        ours = spec_eval.speculative(target, dr, prompt, n_new, "cpu")
        assert ours.tokens[:len(z_tokens)] == z_tokens[:len(ours.tokens)]
        # block by block, up to where z-lab starts clipping its blocks at max_new_tokens
        # (a block counts when even a fully accepted one would have fit)
        whole, done = 0, 0
        for a in z_acc:
            if done + dr.block_size + 1 > n_new:
                break
            whole, done = whole + 1, done + a
        assert whole >= 2 and ours.accept_lengths[:whole] == z_acc[:whole], (ours.accept_lengths, z_acc)
        accepted += z_acc[:whole]
    assert max(accepted) > 2, accepted      # the drafters accept: the comparison is not all 1s



def _shipped_module_serves_the_pattern(out, model, dr, zm):
    """The export's modeling_dflash.py, without a mask, as z-lab's class: whole, and with a
    cache holding the first part of the context (its generation loop's calling convention)."""
    from transformers import AutoModel, DynamicCache

    shipped = AutoModel.from_pretrained(str(out), trust_remote_code=True,
                                        dtype=torch.float32).eval()
    prompt = PROMPTS[0]
    start = len(prompt) - 1
    ctx, block, _ = _inputs(model, dr, prompt, start)
    z = _zlab_forward(zm, model, ctx, block)
    emb = model.get_input_embeddings()(block)
    bs = block.shape[1]
    with torch.no_grad():
        whole = shipped(position_ids=torch.arange(start + bs).unsqueeze(0), noise_embedding=emb,
                        target_hidden=ctx)
        cache = DynamicCache()
        shipped(position_ids=torch.arange(6 + bs).unsqueeze(0), noise_embedding=emb,
                target_hidden=ctx[:, :6], past_key_values=cache)
        cache.crop(-bs)                                           # keep the 6 context positions
        pos = torch.cat([torch.arange(6, start), torch.arange(start, start + bs)]).unsqueeze(0)
        cached = shipped(position_ids=pos, noise_embedding=emb, target_hidden=ctx[:, 6:],
                         past_key_values=cache)
    torch.testing.assert_close(whole, z, rtol=0, atol=2e-5)
    torch.testing.assert_close(cached, z, rtol=0, atol=2e-5)


@pytest.mark.parametrize("released", [
    # z-lab's Qwen3.6-27B DFlash shape: 4 sliding + 1 full, no is_causal (sliding layers causal)
    {"layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 12},
    # gemma-style: causal sliding layers (is_causal absent; sliding only)
    {"layer_types": ["sliding_attention"] * 2, "sliding_window": 12},
])
def test_released_style_drafters_fine_tune_with_their_own_pattern(env, released, tmp_path):
    """A released-style directory (its config.json says only layer_types and a window) goes
    through init_from -> 3 steps -> export and z-lab's class serves it as trained."""
    from trainer.model.dflash_dir import read_dflash_dir
    from trainer.evaluate.export_dir import load_exported

    n = len(released["layer_types"])
    name = f"released{n}"
    _, ckpt = _train(env, name, {"train.max_steps": 20, "model.drafter_layers": n, "model.target_layer_ids": "[1,2]",
                                 "model.layer_types": "[" + ",".join(released["layer_types"]) + "]",
                                 "model.sliding_window": 12, "model.is_causal": "null"})
    rel = tmp_path / "released"
    conf = _export(ckpt, rel, "z-lab,vllm,sglang")
    conf.pop("is_causal", None)                  # as released: the legacy rule decides
    conf["dflash_config"].pop("causal", None)    # nor vLLM's dflash_config.causal
    (rel / "config.json").write_text(json.dumps(conf))
    src = read_dflash_dir(str(rel), flag="--model.init_from")
    assert [(la.window, la.causal) for la in src.drafter.attention] == \
        [(12, True) if t == "sliding_attention" else (0, False) for t in released["layer_types"]]
    cfg, tuned = _train(env, name + "-tuned", {"model.init_from": str(rel), "model.drafter_layers": n},
                        steps=3)
    assert cfg.model.is_causal is None and cfg.model.layer_types == released["layer_types"]
    out_conf = _export(tuned, tmp_path / "out", "z-lab,vllm,sglang")
    assert out_conf["layer_types"] == released["layer_types"]
    model = _target(env)
    zm = _zlab_model(out_conf, tmp_path / "out")
    dr = load_exported(str(tmp_path / "out"), embed_tokens=model.get_input_embeddings(),
                       lm_head=model.get_output_embeddings()).eval()
    assert dr.spec.pattern == src.drafter.attention
    for prompt in PROMPTS:
        ctx, block, pos = _inputs(model, dr, prompt, len(prompt) - 1)
        torch.testing.assert_close(_dfo_forward(dr, dr.spec.pattern, ctx, block, pos),
                                   _zlab_forward(zm, model, ctx, block), rtol=0, atol=2e-5)
