"""dfo_contract.trainer_config: YAML + dotted overrides + validation that names the flag (torch-free)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dfo_contract.trainer_config import load_config, parse_overrides, TrainerConfig
from dfo_contract.exitcodes import TrainerConfigError


def _yaml(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_defaults_yaml_and_overrides(tmp_path):
    p = _yaml(tmp_path, "model:\n  block_size: 8\n  target_path: /t\ndata:\n  path: d.jsonl\n"
                        "  seq_buckets: [128, 256]\ntrain:\n  lr: 1.0e-3\n")
    cfg = load_config(p, ["--train.micro_batch", "4", "--model.attention=sdpa",
                          "--data.anchor_buckets", "8,16", "--compile.gate", "false",
                          "--model.mask_token_id", "none", "--data.max_seq_len", "256",
                          "--data.num_anchors", "16"])
    assert cfg.model.block_size == 8 and cfg.train.lr == 1e-3 and cfg.train.micro_batch == 4
    assert cfg.model.attention == "sdpa" and cfg.compile.gate is False
    assert cfg.data.anchor_buckets == [8, 16] and cfg.seq_buckets() == [128, 256]
    assert cfg.gamma() == 4.0 and cfg.min_loss_tokens() == 16
    assert TrainerConfig().train.lr == 6e-4 and TrainerConfig().train.warmup_ratio == 0.04
    assert TrainerConfig().train.grad_clip == 1.0


def test_gamma_defaults():
    from dfo_contract.trainer_config import default_gamma

    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)


@pytest.mark.parametrize("args,flag,what", [
    (["--train.micro_batch", "0"], "--train.micro_batch", "expected a positive integer, got 0"),
    (["--train.micro_batch", "x"], "--train.micro_batch", "expected an integer"),
    (["--model.attention", "dense"], "--model.attention", "expected one of"),
    (["--model.block_size", "1"], "--model.block_size", ">= 2"),
    (["--train.lr", "-1"], "--train.lr", "positive"),
    (["--parallel.layout", "fsdp"], "--parallel.layout", "expected one of"),
    (["--model.target_layer_ids", "[1,1]"], "--model.target_layer_ids", "duplicate"),
    (["--data.seq_buckets", "[64]", "--data.max_seq_len", "128"], "--data.seq_buckets", "largest"),
    (["--compile.gate", "maybe"], "--compile.gate", "true or false"),
    (["--parallel.drafter_devices", "[gpu0]"], "--parallel.drafter_devices", "devices like"),
    (["--train.nope", "1"], "train.nope", "unknown key"),
])
def test_validation_names_the_flag(args, flag, what):
    with pytest.raises(TrainerConfigError) as ei:
        load_config(None, ["--data.path", "d.jsonl", *args])
    msg = str(ei.value)
    assert msg.startswith("config: ") and flag in msg and what in msg and "\n" not in msg


def test_micro_batch_message_exact():
    with pytest.raises(TrainerConfigError) as ei:
        load_config(None, ["--data.path", "d", "--train.micro_batch", "0"])
    assert str(ei.value) == "config: --train.micro_batch: expected a positive integer, got 0"


def test_yaml_errors(tmp_path):
    with pytest.raises(TrainerConfigError, match="unknown key 'model.nope'"):
        load_config(_yaml(tmp_path, "model:\n  nope: 1\ndata:\n  path: x\n"))
    with pytest.raises(TrainerConfigError, match=r"c.yaml:\d+: invalid YAML"):
        load_config(_yaml(tmp_path, "model:\n  a: [1\n"))
    with pytest.raises(TrainerConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(TrainerConfigError, match="--data.path: required"):
        load_config(_yaml(tmp_path, "model:\n  block_size: 8\n"))


def test_parse_overrides_rejects_positional():
    with pytest.raises(TrainerConfigError, match="unexpected argument"):
        parse_overrides(["oops"])
    with pytest.raises(TrainerConfigError, match="missing value"):
        parse_overrides(["--train.lr"])


def test_config_and_manifest_import_no_torch():
    code = ("import sys, trainer, dfo_contract.trainer_config, dfo_contract.checkpoints, "
            "dfo_contract.exitcodes, dfo_contract.faultspec, dfo_contract.markers, dfo_contract.fsio; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert not any(m.split('.')[0] in ('orchestrator', 'yaml') and m.startswith('orchestrator') "
            "for m in sys.modules), 'orchestrator imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_example_configs_load():
    for p in ("orchestrator/config/defaults/tiny-cpu.yaml", "orchestrator/config/defaults/bench-h200.yaml"):
        cfg = load_config(p)
        assert cfg.model.block_size in (8, 16)
