"""`model.init_from` with what one engine spells its own way, through the real CLI on the
local transport (dfo launch reads the directory in its one round trip) and the trainer's
own reading of the directory: vLLM's `dflash_config.causal` is read as vLLM reads it; keys
that disagree, vLLM's sink biases and sliding-window keys that say something else, and a
MiMo `mask_embedding.pt` are refused in one line before anything is launched."""

from __future__ import annotations

import copy
import json

import pytest

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import effective_config, load_config
from tests.test_init_from_launch import DRAFTER, dfo, host  # noqa: F401
from trainer.model.dflash_dir import read_dflash_dir


def write(d, conf, *files):
    d.mkdir()
    (d / "config.json").write_text(json.dumps(conf))
    for f in files:
        (d / f).write_bytes(b"\0")
    return str(d)


def dry_run(capsys, hosts, cfg, path):
    return dfo(capsys, hosts, "launch", "--config", str(cfg), "--dry-run", "--json",
               "--no-env-check", "--set", f"model.init_from={path}")


def conf_with(**edits):
    c = copy.deepcopy(DRAFTER)
    for k, v in edits.items():
        if k.startswith("dc_"):
            c["dflash_config"][k[3:]] = v
        elif v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


@pytest.mark.parametrize("edits, files, says", [
    ({}, ("mask_embedding.pt",), "a separate mask embedding (MiMo's mask_embedding.pt)"),
    ({"attention_sink_bias": True}, (), "attention sinks (attention_sink_bias: True)"),
    ({"dc_add_swa_attention_sink_bias": True}, (), "attention sinks (add_swa_attention_sink_bias"),
    ({"dc_causal": True}, (), "is_causal False and dflash_config.causal True disagree"),
    ({"dc_use_swa": True, "dc_swa_window_size": 64}, (), "vLLM's sliding-window keys"),
    ({"layer_types": ["sliding_attention"] * 2, "sliding_window": 32}, (),
     "sliding_window 32 without use_sliding_window: true: z-lab's class"),
])
def test_a_spelling_read_differently_by_engines_is_refused_before_launch(host, capsys, edits,  # noqa: F811
                                                                         files, says):
    tmp, cfg, hosts = host
    path = write(tmp / "d", conf_with(**edits), *files)
    rc, out, err = dry_run(capsys, hosts, cfg, path)
    assert rc == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp / "root" / "runs").exists()
    # the trainer reads the directory the same way (a weights file beside it)
    (tmp / "d" / "model.safetensors").write_bytes(b"")
    with pytest.raises(TrainerConfigError, match="--model.init_from") as e:
        read_dflash_dir(path, flag="--model.init_from")
    assert says in str(e.value)


def test_vllms_dflash_config_causal_is_read_as_vllm_reads_it(host, capsys):  # noqa: F811
    tmp, cfg, hosts = host
    causal = write(tmp / "causal", conf_with(is_causal=None, dc_causal=True))
    legacy = write(tmp / "legacy", conf_with(is_causal=None))
    rc, out, err = dry_run(capsys, hosts, cfg, causal)
    assert rc == 0, err
    rc2, out2, _ = dry_run(capsys, hosts, cfg, legacy)
    assert rc2 == 0
    # another attention pattern: another compile-cache key
    assert json.loads(out)["env"]["DFO_CACHE_KEY"] != json.loads(out2)["env"]["DFO_CACHE_KEY"]
    args = ["--data.path", "/d/x.jsonl", "--model.init_from", causal]
    m = effective_config(load_config(None, args), conf_with(is_causal=None, dc_causal=True)).model
    assert m.is_causal is True
    # restated vLLM window keys are no conflict
    ok = conf_with(layer_types=["sliding_attention"] * 2, sliding_window=32,
                   use_sliding_window=True, dc_use_swa=True, dc_swa_window_size=32)
    assert effective_config(load_config(None, args), ok).model.sliding_window == 32
