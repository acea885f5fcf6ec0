"""``model.init_from``: a released DFlash drafter (dfo's export or z-lab's layout) as the
drafter's initial weights, its taps/block size/mask token, one-line refusals."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dfo_contract.exitcodes import TrainerConfigError
from tests.helpers.trainer import make_target, run_trainer, tiny_config, tiny_overrides, trained_checkpoint
from trainer.evaluate.export_dir import export
from trainer.core import init_from


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    t = trained_checkpoint(tmp_path_factory.mktemp("released"))
    t["fp32"] = str(t["dir"] / "fp32")
    t["bf16"] = str(t["dir"] / "bf16")
    export(t["ckpt"], t["fp32"], dtype="fp32")
    export(t["ckpt"], t["bf16"])
    return t


def _cfg(released, tmp_path, **extra):
    """A run config naming neither taps, block size, drafter layers nor mask token."""
    return tiny_config(released["target"], released["data"], str(tmp_path / "run"),
                       **{"model.init_from": released["fp32"], **extra})


def _plain_cfg(released, tmp_path, **extra):
    from dfo_contract.trainer_config import load_config

    args = tiny_overrides(released["target"], released["data"], str(tmp_path / "run"), **extra)
    drop = {"--model.drafter_layers", "--model.block_size"}
    keep = []
    for k, v in zip(args[::2], args[1::2], strict=True):
        if k not in drop:
            keep += [k, v]
    return load_config(None, keep)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_export_init_from_export_is_bit_for_bit(released, tmp_path, dtype):
    from trainer.core import checkpoints
    from trainer.train.run import Schedule
    from trainer.core.step import build_models

    cfg = _plain_cfg(released, tmp_path, **{"model.init_from": released[dtype]})
    init_from.resolve(cfg)
    m = cfg.model
    assert (m.drafter_layers, m.target_layer_ids, m.block_size, m.mask_token_id) == (2, [1, 2], 8, 3)
    _, drafter = build_models(cfg, "cpu")
    ck = checkpoints.save(str(tmp_path / "ck"), 0, drafter=drafter,
                          optimizer=torch.optim.AdamW(drafter.trainable_parameters()),
                          scheduler=Schedule(cfg), data_state={}, config_yaml=cfg.to_yaml(), keep=1)
    again = tmp_path / "again"
    export(ck, str(again), dtype=dtype)
    a = load_file(os.path.join(released[dtype], "model.safetensors"))
    b = load_file(str(again / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ca = json.loads(open(os.path.join(released[dtype], "config.json")).read())
    cb = json.loads((again / "config.json").read_text())
    assert ca == cb


def _zlab_layout(released, tmp_path):
    """z-lab's published layout: block_size top-level only, RoPE as rope_theta only, no
    manifest, their module file name."""
    d = tmp_path / "zlab"
    d.mkdir()
    conf = json.loads(open(os.path.join(released["bf16"], "config.json")).read())
    conf.pop("rope_parameters")
    conf["dflash_config"].pop("block_size")
    conf["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (d / "config.json").write_text(json.dumps(conf))
    shutil.copy(os.path.join(released["bf16"], "model.safetensors"), d / "model.safetensors")
    return str(d)


def test_zlab_layout_and_training_from_it(released, tmp_path):
    z = _zlab_layout(released, tmp_path)
    run = run_trainer(["train", *tiny_overrides(released["target"], released["data"],
                                                str(tmp_path / "run"), **{
                                                    "model.init_from": z, "train.max_steps": 2})])
    # tiny_overrides sets drafter_layers 1: an explicit conflict with the drafter's 2
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "--model.drafter_layers: 1 conflicts with the drafter's 2" in run.stderr
    args = tiny_overrides(released["target"], released["data"], str(tmp_path / "run"),
                          **{"model.init_from": z, "train.max_steps": 2})
    i = args.index("--model.drafter_layers")
    del args[i:i + 2]
    run = run_trainer(["train", *args])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "resumed" not in run.stdout
    import yaml

    saved = yaml.safe_load(open(tmp_path / "run" / "checkpoints" / "step_2" / "config.yaml"))
    assert saved["model"]["target_layer_ids"] == [1, 2] and saved["model"]["drafter_layers"] == 2
    data = json.load(open(tmp_path / "run" / "checkpoints" / "step_2" / "data.json"))
    assert data["step"] == 2                                 # counted from 0, nothing resumed


@pytest.mark.parametrize("flag,value,want", [
    ("model.block_size", "16", "--model.block_size: 16 conflicts with the drafter's 8"),
    ("model.target_layer_ids", "[0,2]", r"--model.target_layer_ids: \[0, 2\] conflicts with the drafter.s \[1, 2\]"),
    ("model.mask_token_id", "5", "--model.mask_token_id: 5 conflicts with the drafter's 3"),
])
def test_conflicting_settings_name_the_flag(released, tmp_path, flag, value, want):
    cfg = _cfg(released, tmp_path, **{flag: value, "model.drafter_layers": 2})
    with pytest.raises(TrainerConfigError, match=want) as ei:
        init_from.resolve(cfg)
    assert "\n" not in str(ei.value) and "--model.init_from" in str(ei.value)
    # the same value given explicitly is no conflict
    ok = _cfg(released, tmp_path, **{"model.block_size": 8, "model.drafter_layers": 2})
    assert init_from.resolve(ok).model.block_size == 8


def test_refuses_a_drafter_of_another_target(released, tmp_path):
    from trainer.core.step import build_models

    other = make_target(str(tmp_path / "t5"), layers=5)
    cfg = _plain_cfg(released, tmp_path, **{"model.init_from": released["fp32"],
                                            "model.target_path": other})
    init_from.resolve(cfg)
    with pytest.raises(TrainerConfigError, match=r"--model.init_from: .* a target with layer "
                                                 r"count 4, but .* has 5") as ei:
        build_models(cfg, "cpu")
    assert "\n" not in str(ei.value)
    wide = make_target(str(tmp_path / "wide"), layers=4)
    conf = json.loads(open(os.path.join(released["fp32"], "config.json")).read())
    bad = tmp_path / "bad"
    shutil.copytree(released["fp32"], bad)
    conf["hidden_size"] = 96
    (bad / "config.json").write_text(json.dumps(conf))
    cfg = _plain_cfg(released, tmp_path, **{"model.init_from": str(bad), "model.target_path": wide})
    init_from.resolve(cfg)
    with pytest.raises(TrainerConfigError, match="hidden size 96, but .* has 64"):
        build_models(cfg, "cpu")


def test_refuses_what_is_not_a_drafter_dir(released, tmp_path):
    for setup, want in [(lambda d: None, "no config.json"),
                        (lambda d: (d / "config.json").write_text("{}"), "no dflash_config"),
                        (lambda d: (d / "config.json").write_text(json.dumps(
                            {"dflash_config": {}, "num_hidden_layers": 1})), "no \\*.safetensors")]:
        d = tmp_path / f"d{len(os.listdir(tmp_path))}"
        d.mkdir()
        setup(d)
        cfg = _cfg(released, tmp_path, **{"model.init_from": str(d)})
        with pytest.raises(TrainerConfigError, match=want) as ei:
            init_from.resolve(cfg)
        assert str(ei.value).startswith("config: --model.init_from: ") and "\n" not in str(ei.value)


def _variant(released, tmp_path, conf_edit=None, extra_tensors=None):
    d = tmp_path / "variant"
    shutil.copytree(released["fp32"], d)
    conf = json.loads((d / "config.json").read_text())
    if conf_edit:
        conf_edit(conf)
    (d / "config.json").write_text(json.dumps(conf))
    if extra_tensors:
        from safetensors.torch import save_file

        save_file(extra_tensors, str(d / "extra.safetensors"))
    return str(d)


@pytest.mark.parametrize("edit,tensors,msg", [
    (lambda c: c.update(input_embedding_scale=2.0), None, "input_embedding_scale 2.0"),
    (lambda c: c["dflash_config"].update(input_embedding_scale=0.5), None, "input_embedding_scale 0.5"),
    (None, {"layers.0.self_attn.sinks": torch.zeros(4)}, r"attention sinks \(layers.0.self_attn.sinks\)"),
    (lambda c: c["dflash_config"].update(attention_sinks=True), None, "attention sinks"),
    (None, {"mask_embedding": torch.zeros(64)}, r"a separate mask embedding \(mask_embedding\)"),
    (lambda c: c.update(layer_types=["chunked_attention", "full_attention"]), None,
     "layer type 'chunked_attention' is not one dfo trains"),
    (lambda c: c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=None),
     None, "sliding_attention layers without a sliding_window"),
])
def test_parts_dfo_cannot_train_are_refused_in_one_line(released, tmp_path, edit, tensors, msg):
    d = _variant(released, tmp_path, edit, tensors)
    with pytest.raises(TrainerConfigError, match=msg) as e:
        init_from.resolve(_plain_cfg(released, tmp_path, **{"model.init_from": d}))
    assert str(e.value).startswith(f"config: --model.init_from: {d}: ") and "\n" not in str(e.value)


def test_a_released_hybrid_gives_its_attention_and_a_conflicting_flag_is_named(released, tmp_path):
    def hybrid(c):
        c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=16,
                 use_sliding_window=True)
        c.pop("is_causal", None)
        c["dflash_config"].pop("causal", None)     # a released hybrid declares neither
    d = _variant(released, tmp_path, hybrid)
    cfg = _plain_cfg(released, tmp_path, **{"model.init_from": d})
    init_from.resolve(cfg)
    assert (cfg.model.layer_types, cfg.model.sliding_window, cfg.model.is_causal) == \
        (["sliding_attention", "full_attention"], 16, None)
    with pytest.raises(TrainerConfigError, match="--model.is_causal: False conflicts with the "
                                                 "drafter's None"):
        init_from.resolve(_plain_cfg(released, tmp_path, **{"model.init_from": d,
                                                            "model.is_causal": "false"}))
