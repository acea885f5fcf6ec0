"""``model.init_from`` with a DFlash2 drafter directory (the layout SGLang and vLLM load, as dfo's
DFlash2 export writes it): its settings and weights bit for bit, the same forward, and the
one-line refusals (method, conflicting settings, shapes)."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import load_config
from dfo_contract.trainer_config.methods import DFlash2Settings
from tests.helpers.trainer import make_synth, make_target, run_trainer, tiny_overrides
from trainer.evaluate.export_dir import export, load_exported
from trainer.model import attention, blocks
from trainer.core import init_from

D2 = {"model.method": "dflash2", "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]",
      "model.selector_rank": 8, "model.selector_top_k": 4, "model.sliding_window": 24}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A tiny DFlash2 drafter trained 3 steps and exported (fp32), and a DFlash one's export."""
    from trainer.train.loop import train

    d = tmp_path_factory.mktemp("released2")
    target = make_target(str(d / "target"))
    data = make_synth(str(d / "synth.jsonl"), num=24)
    for name, method in (("x2", D2), ("x1", {**D2, "model.method": "dflash"})):
        cfg = load_config(None, tiny_overrides(target, data, str(d / name / "run"),
                                               **{**method, "train.max_steps": 3, "train.lr": 1e-2}))
        assert train(cfg, out=io.StringIO()) == 0
        export(str(d / name / "run" / "checkpoints" / "step_3"), str(d / name / "out"), dtype="fp32")
    ckpt = str(d / "x2" / "run" / "checkpoints" / "step_3")
    return {"dir": d, "target": target, "data": data, "ckpt": ckpt, "x2": str(d / "x2" / "out"),
            "x1": str(d / "x1" / "out")}


def _cfg(released, tmp_path, **extra):
    """A fresh run config that names only the method among the drafter's settings."""
    args = tiny_overrides(released["target"], released["data"], str(tmp_path / "run"),
                          **{"model.init_from": released["x2"], "model.method": "dflash2", **extra})
    drop = {"--model.drafter_layers", "--model.block_size"} - {f"--{k}" for k in extra}
    keep = []
    for k, v in zip(args[::2], args[1::2], strict=True):
        if k not in drop:
            keep += [k, v]
    return load_config(None, keep)


def _hidden(drafter, target, seed=3):
    from trainer.core.step import dummy_batch

    b = dummy_batch(load_config(None, ["--data.path", "x", "--model.block_size", "8"]), 48, 4, 2,
                    "cpu", seed=seed)
    ids = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, 8, drafter.mask_token_id)
    mask = attention.build_mask("sdpa", b.anchors, b.anchor_valid, 48, 8, 24)
    with torch.no_grad():
        h = drafter(target.features(b.input_ids), ids, blocks.block_positions(b.anchors, 8),
                    lambda q, k, v: attention.attend("sdpa", q, k, v, mask))
        return h, drafter.greedy_path(h.view(2, 4, 8, -1), ids[:, ::8])


def test_init_from_a_dflash2_export_is_bit_for_bit(released, tmp_path):
    from trainer.train.loop import train
    from trainer.core.step import build_models

    cfg = _cfg(released, tmp_path)
    init_from.resolve(cfg)
    m = cfg.model
    assert (m.drafter_layers, m.target_layer_ids, m.block_size, m.mask_token_id) == (2, [1, 2], 8, 3)
    assert m.sliding_window == 24
    assert m.settings_of(DFlash2Settings) == DFlash2Settings(
        selector_rank=8, selector_top_k=4, conv_kernel_size=2, conv_group_size=16,
        final_logit_softcapping=20.0, output_multiplier=1.0)
    target, drafter = build_models(cfg, "cpu")
    trained = load_file(os.path.join(released["ckpt"], "drafter.safetensors"))
    mine = drafter.trainable_state_dict()
    assert set(mine) == set(trained) and any("candidate_selector" in k for k in mine)
    for k, v in trained.items():
        assert mine[k].dtype == v.dtype and torch.equal(mine[k], v), k
    served = load_exported(released["x2"], embed_tokens=target.embed_tokens, lm_head=target.lm_head)
    (h_mine, p_mine), (h_served, p_served) = _hidden(drafter, target), _hidden(served, target)
    assert torch.equal(h_mine, h_served) and torch.equal(p_mine, p_served)
    # the loop resolves it too: a run starts from these weights and records the settings
    run = _cfg(released, tmp_path, **{"train.max_steps": 1})
    assert train(run, out=io.StringIO()) == 0
    import yaml

    saved = yaml.safe_load(open(tmp_path / "run" / "checkpoints" / "step_1" / "config.yaml"))
    assert saved["model"]["method"] == "dflash2" and saved["model"]["selector_rank"] == 8
    assert saved["model"]["sliding_window"] == 24 and saved["model"]["drafter_layers"] == 2


def test_a_drafter_of_the_other_method_is_one_line(released, tmp_path):
    cfg = _cfg(released, tmp_path, **{"model.init_from": released["x1"]})
    with pytest.raises(TrainerConfigError) as ei:
        init_from.resolve(cfg)
    msg = str(ei.value)
    assert msg == (f"config: --model.method: dflash2 cannot start from --model.init_from "
                   f"{released['x1']}, a DFlash drafter; set --model.method dflash or give a "
                   "DFlash2 drafter")
    # a DFlash2 drafter given to a DFlash run (the default method): the trainer exits 2, one line
    args = tiny_overrides(released["target"], released["data"], str(tmp_path / "r1"),
                          **{"model.init_from": released["x2"], "train.max_steps": 1})
    i = args.index("--model.drafter_layers")
    del args[i:i + 2]
    r = run_trainer(["train", *args])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert ("--model.method: dflash cannot start from --model.init_from "
            f"{released['x2']}, a DFlash2 drafter; set --model.method dflash2") in r.stderr


@pytest.mark.parametrize("flag,value,want", [
    ("model.selector_rank", "16", "--model.selector_rank: 16 conflicts with the drafter's 8"),
    ("model.sliding_window", "0", "--model.sliding_window: 0 conflicts with the drafter's 24"),
    ("model.block_size", "16", "--model.block_size: 16 conflicts with the drafter's 8"),
])
def test_conflicting_dflash2_settings_name_the_flag(released, tmp_path, flag, value, want):
    cfg = _cfg(released, tmp_path, **{flag: value})
    with pytest.raises(TrainerConfigError, match=want) as ei:
        init_from.resolve(cfg)
    assert "\n" not in str(ei.value) and f"drop --{flag} or set it to" in str(ei.value)


def test_weights_of_another_shape_are_one_line(released, tmp_path):
    """config.json says conv groups of 32, the weights were made with 16: refused by shape."""
    from trainer.core.step import build_models

    bad = tmp_path / "bad"
    shutil.copytree(released["x2"], bad)
    conf = json.loads((bad / "config.json").read_text())
    conf["dflash_config"]["conv_group_size"] = 32
    (bad / "config.json").write_text(json.dumps(conf))
    cfg = _cfg(released, tmp_path, **{"model.init_from": str(bad)})
    init_from.resolve(cfg)
    assert cfg.model.settings_of(DFlash2Settings).conv_group_size == 32
    with pytest.raises(TrainerConfigError, match=r"^config: --model.init_from: .*bad: drafter weight "
                                                 r"layers\.0\.attention_conv\.kernel_projection") as ei:
        build_models(cfg, "cpu")
    assert "\n" not in str(ei.value)
