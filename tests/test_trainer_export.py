"""The servable export: z-lab/SGLang DFlash layout, rebuilt from the directory alone."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.helpers.trainer import PY, REPO, trained_checkpoint
from trainer.evaluate.export_dir import export, load_exported, verify_export


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_checkpoint(tmp_path_factory.mktemp("export"))


def _checkpoint_drafter(trained):
    from trainer.core import checkpoints
    from trainer.core.step import build_models

    target, drafter = build_models(trained["cfg"], "cpu")
    checkpoints.load(trained["ckpt"], drafter=drafter, restore_rng=False)
    return target, drafter


def _logits(drafter, target, seed=0):
    from trainer.model import attention, blocks
    from trainer.core.step import dummy_batch

    b = dummy_batch(trained_cfg(drafter), 64, 8, 2, "cpu", seed=seed)
    feats = target.features(b.input_ids)
    ids = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, 8, drafter.mask_token_id)
    pos = blocks.block_positions(b.anchors, 8)
    mask = attention.build_mask("sdpa", b.anchors, b.anchor_valid, 64, 8)
    with torch.no_grad():
        h = drafter(feats, ids, pos, lambda q, k, v: attention.attend("sdpa", q, k, v, mask))
        return drafter.shared.lm_head(h)


def trained_cfg(_drafter):
    from dfo_contract.trainer_config import load_config

    return load_config(None, ["--model.block_size", "8", "--data.path", "x", "--model.target_path", "y"])


def test_export_reproduces_checkpoint_logits(trained, tmp_path):
    target, drafter = _checkpoint_drafter(trained)
    man = export(trained["ckpt"], str(tmp_path / "fp32"), dtype="fp32")
    assert man["step"] == 3
    re = load_exported(str(tmp_path / "fp32"), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    assert re.mask_token_id == drafter.mask_token_id == 3
    torch.testing.assert_close(_logits(re, target), _logits(drafter, target), rtol=0, atol=1e-6)
    # bf16 (the default): the same drafter up to bf16 rounding of the weights
    export(trained["ckpt"], str(tmp_path / "bf16"))
    rb = load_exported(str(tmp_path / "bf16"), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    diff = (_logits(rb, target) - _logits(drafter, target)).abs().max().item()
    assert diff < 0.1


def test_export_layout_and_names(trained, tmp_path):
    from safetensors import safe_open
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    out = tmp_path / "x"
    export(trained["ckpt"], str(out))
    assert sorted(os.listdir(tmp_path)) == ["x"]                      # no temp dir left behind
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "dfo_export.json",
                                       "model.safetensors", "modeling_dflash.py"]
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"]
    assert conf["block_size"] == 8 and conf["num_hidden_layers"] == 2 and conf["num_target_layers"] == 4
    assert conf["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [1, 2], "block_size": 8,
                                     "causal": conf["is_causal"]}   # vLLM < 0.28, LMDeploy
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "rms_norm_eps", "vocab_size", "max_position_embeddings"):
        assert k in conf
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_tensor(n).dtype for n in names} == {torch.bfloat16}
    # the module's names: a Qwen3 decoder layer's, per layer, plus fc / hidden_norm / norm
    layer = Qwen3DecoderLayer(Qwen3Config(**{k: conf[k] for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size")}), 0)
    want = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{n}" for i in range(2) for n in layer.state_dict()}
    assert names == want
    readme = (out / "README.md").read_text()
    assert "steps: 3" in readme and trained["target"] in readme and "acceptance length" in readme
    assert verify_export(str(out)) == (True, "ok")
    (out / "README.md").write_text("changed")
    assert not verify_export(str(out))[0]


def test_export_cli(trained, tmp_path):
    r = subprocess.run([PY, "-m", "trainer", "export", trained["ckpt"], "--out", str(tmp_path / "c")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 3
    bad = subprocess.run([PY, "-m", "trainer", "export", str(tmp_path / "nope"), "--out",
                          str(tmp_path / "d")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 4 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_a_causal_drafter_is_refused_for_llama_cpp_and_exported_for_the_rest(tmp_path):
    """A drafter trained causal within the block: llama.cpp would run it bidirectionally (its
    converter carries only `is_causal: false`), so the default export (every engine) refuses
    it in one line, exit 2, writing nothing; for the other engines it writes `is_causal` and
    `dflash_config.causal` alike."""
    import io

    from tests.helpers.trainer import make_synth, make_target, tiny_config
    from trainer.train.loop import train

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "synth.jsonl"), num=16)
    cfg = tiny_config(target, data, str(tmp_path / "run"), **{
        "train.max_steps": 2, "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]",
        "model.is_causal": "true"})
    assert train(cfg, out=io.StringIO()) == 0
    ckpt = str(tmp_path / "run" / "checkpoints" / "step_2")
    r = subprocess.run([PY, "-m", "trainer", "export", ckpt, "--out", str(tmp_path / "all")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert ("llama.cpp serves layer 0 as full, bidirectional within the block, but it was "
            "trained full, causal within the block; train with --model.is_causal false for "
            "it, or export for the other engines only (--engines "
            "z-lab,vllm,vllm-0.27,sglang,lmdeploy)") in r.stderr
    assert not (tmp_path / "all").exists()
    man = export(ckpt, str(tmp_path / "rest"), engines="z-lab,vllm,vllm-0.27,sglang,lmdeploy")
    conf = json.loads((tmp_path / "rest" / "config.json").read_text())
    assert man["step"] == 2 and conf["is_causal"] is True
    assert conf["dflash_config"]["causal"] is True
