"""The export as the serving engines' loaders read it: RoPE in both spellings, what the
drafter really is (full attention, no biases), transformers' trust_remote_code path."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers.trainer import trained_checkpoint
from trainer.evaluate.export_dir import export, load_exported
from trainer.evaluate.export_config import rope_fields


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_checkpoint(tmp_path_factory.mktemp("loaders"))


def _target_variant(trained, tmp_path, **fields):
    """A copy of the tiny target whose config.json has ``fields`` changed (the export reads
    the target's config only)."""
    d = tmp_path / "target-variant"
    shutil.copytree(trained["target"], d)
    conf = json.loads((d / "config.json").read_text())
    conf.update(fields)
    (d / "config.json").write_text(json.dumps(conf))
    return str(d)


def test_rope_fields_agree():
    assert rope_fields({"rope_type": "default", "rope_theta": 1e6}) == {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_theta": 1e6,
        "rope_scaling": None}
    yarn = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
            "original_max_position_embeddings": 32768}
    f = rope_fields(yarn)
    assert f["rope_theta"] == 5e5 and f["rope_parameters"] == yarn
    assert f["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 32768}


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 1e6},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 1024},
])
def test_config_has_rope_in_both_spellings(trained, tmp_path, rope):
    target = _target_variant(trained, tmp_path, rope_parameters=rope)
    out = tmp_path / "x"
    export(trained["ckpt"], str(out), target_path=target)
    conf = json.loads((out / "config.json").read_text())
    # transformers 4.x and z-lab's MLX loader read the top-level fields (cfg["rope_theta"])
    assert conf["rope_theta"] == 1e6 == conf["rope_parameters"]["rope_theta"]
    scaling = conf["rope_scaling"]
    if rope["rope_type"] == "default":
        assert scaling is None
    else:
        assert scaling == {k: v for k, v in rope.items() if k != "rope_theta"}
    # and transformers (5.x here) reads the same RoPE back
    from transformers import AutoConfig

    back = AutoConfig.from_pretrained(str(out), local_files_only=True)
    assert back.rope_parameters["rope_theta"] == 1e6
    assert back.rope_parameters["rope_type"] == rope["rope_type"]


def test_config_is_the_drafters_not_the_targets(trained, tmp_path):
    """A sliding-window target with biased attention: the drafter has neither."""
    target = _target_variant(trained, tmp_path, sliding_window=16, use_sliding_window=True,
                             max_window_layers=1, attention_bias=True,
                             layer_types=["full_attention", "sliding_attention",
                                          "sliding_attention", "sliding_attention"])
    out = tmp_path / "x"
    export(trained["ckpt"], str(out), target_path=target)
    conf = json.loads((out / "config.json").read_text())
    assert conf["layer_types"] == ["full_attention", "full_attention"]
    assert conf["sliding_window"] is None and conf["use_sliding_window"] is False
    assert conf["attention_bias"] is False and conf["hidden_act"] == "silu"
    assert conf["head_dim"] == 16
    readme = (out / "README.md").read_text()
    assert ('"method": "dflash"' in readme and '"model": "THIS_DIR"' in readme
            and '"num_speculative_tokens": 7' in readme)                     # B - 1, B = 8
    assert "--speculative-algorithm DFLASH" in readme and "trust_remote_code=True" in readme


def _inputs(target, b=2, s=24, blk=8, seed=0):
    """Tapped target features of random context, one block per row at ``anchor``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 128, (b, s), generator=g)
    feats = target.features(ids)
    block = torch.full((b, blk), 3)
    block[:, 0] = ids[:, -1]
    pos = torch.arange(s, s + blk).expand(b, blk)
    return feats, block, pos


def test_trust_remote_code_loads_every_weight_and_matches(trained, tmp_path):
    from transformers import AutoModel

    from trainer.core import checkpoints
    from trainer.core.step import build_models

    out = tmp_path / "fp32"
    export(trained["ckpt"], str(out), dtype="fp32")
    model, info = AutoModel.from_pretrained(str(out), trust_remote_code=True,
                                            output_loading_info=True, dtype=torch.float32)
    assert type(model).__name__ == "DFlashDraftModel"
    assert info["missing_keys"] in (set(), []) and info["unexpected_keys"] in (set(), [])
    assert not info.get("mismatched_keys")
    assert (model.target_layer_ids, model.block_size, model.mask_token_id) == ([1, 2], 8, 3)

    target, drafter = build_models(trained["cfg"], "cpu")
    checkpoints.load(trained["ckpt"], drafter=drafter, restore_rng=False)
    sd = model.state_dict()
    assert set(sd) == set(drafter.trainable_state_dict())
    for k, v in drafter.trainable_state_dict().items():
        assert torch.equal(sd[k], v), k
    feats, block, pos = _inputs(target)
    s = feats.shape[1]
    ctx_pos = torch.arange(s).expand(feats.shape[0], s)
    from trainer.model import attention

    mask = _all_visible(feats.shape[0], block.shape[1], s + block.shape[1])
    with torch.no_grad():
        ours = drafter(feats, block, pos, lambda q, k, v: attention.attend("sdpa", q, k, v, mask))
        theirs = model(position_ids=torch.cat([ctx_pos, pos], 1), attention_mask=mask.safe,
                       noise_embedding=target.embed_tokens(block), target_hidden=feats)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6)

    # z-lab's generation loop: a Cache holds earlier keys/values; the context is then new only
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model(position_ids=torch.cat([ctx_pos[:, :16], pos], 1), noise_embedding=target.embed_tokens(block),
              target_hidden=feats[:, :16], past_key_values=cache)
        cache.crop(-block.shape[1])                             # drop the block, keep 16
        again = model(position_ids=torch.cat([ctx_pos[:, 16:], pos], 1),
                      noise_embedding=target.embed_tokens(block), target_hidden=feats[:, 16:],
                      past_key_values=cache)
    torch.testing.assert_close(again, theirs, rtol=0, atol=1e-5)


def _all_visible(b, tq, kv):
    from trainer.model.attention import SdpaMask

    return SdpaMask(torch.ones(b, tq, kv, dtype=torch.bool))


def test_load_exported_reads_the_new_config(trained, tmp_path):
    out = tmp_path / "x"
    export(trained["ckpt"], str(out), dtype="fp32")
    from trainer.core.step import build_models

    target, _ = build_models(trained["cfg"], "cpu")
    d = load_exported(str(out), embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    assert (d.target_layer_ids, d.block_size, d.mask_token_id) == ([1, 2], 8, 3)


def test_the_export_readme_names_the_method_it_serves_and_tunes():
    from trainer.evaluate.export_config import MODULE_FILE, readme

    kw = dict(target="T", data="d.jsonl", steps=3, accept_len=2.5, block_size=8, layers=2,
              tap_ids=[1], source="ckpt")
    one, two = readme(**kw), readme(**kw, method="dflash2")
    assert one.startswith("# DFlash drafter") and MODULE_FILE in one
    assert "`--model.init_from THIS_DIR`" in one
    assert two.startswith("# DFlash2 drafter") and MODULE_FILE not in two
    assert "`--model.method dflash2 --model.init_from THIS_DIR`" in two
    assert '"num_speculative_tokens": 7' in two
