"""``model.init_from``'s settings from a drafter's config.json (pure, torch-free):
``dfo_contract.trainer_config.drafter_dir.effective_config``, the one function the trainer
and dfo launch / warm-cache apply, and the orchestrator's reading of the host's answer
(``orchestrator.plan.init_from``)."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import effective_config, load_config
from dfo_contract.trainer_config.layers import FULL, SLIDING
from dfo_contract.trainer_config.methods import DFlash2Settings
from orchestrator.common.errors import ConfigError
from orchestrator.plan.init_from import DrafterReply, effective, parse_reply

DIR = "/d/released"
CONF = {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "hidden_size": 64,
        "vocab_size": 128, "num_target_layers": 4, "is_causal": False,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 3, "block_size": 8}}
D2 = {**CONF, "architectures": ["DFlash2DraftModel"],
      "layer_types": [SLIDING, SLIDING], "sliding_window": 32, "use_sliding_window": True,
      "dflash_config": {**CONF["dflash_config"], "conv_kernel_size": 3, "conv_group_size": 8,
                        "selector_rank": 16, "selector_top_k": 4,
                        "final_logit_softcapping": 10.0, "output_multiplier": 2.0}}


def cfg(**sets):
    args = ["--data.path", "/d/x.jsonl", "--model.init_from", DIR]
    for k, v in sets.items():
        args += [f"--{k}", str(v)]
    return load_config(None, args)


def test_the_drafter_fills_what_the_config_leaves_unset():
    c = effective_config(cfg(), copy.deepcopy(CONF))
    m = c.model
    assert (m.drafter_layers, m.target_layer_ids, m.block_size, m.mask_token_id) == (2, [1, 2], 8, 3)
    assert (m.layer_types, m.is_causal, m.sliding_window) == ([FULL, FULL], False, 2048)
    assert c.gamma() == 4.0 and c.min_loss_tokens() == 16   # derived from the drafter's block


def test_a_dflash2_drafter_gives_its_fields_and_attention():
    c = effective_config(cfg(**{"model.method": "dflash2"}), D2)
    m = c.model
    assert m.settings_of(DFlash2Settings) == DFlash2Settings(
        conv_kernel_size=3, conv_group_size=8, selector_rank=16, selector_top_k=4,
        final_logit_softcapping=10.0, output_multiplier=2.0)
    assert (m.layer_types, m.sliding_window, m.is_causal) == ([SLIDING, SLIDING], 32, False)


def test_an_explicit_setting_must_agree_and_the_same_value_is_no_conflict():
    with pytest.raises(TrainerConfigError, match=r"^config: --model.block_size: 16 conflicts with "
                       r"the drafter's 8 in --model.init_from /d/released; drop --model.block_size "
                       r"or set it to 8$"):
        effective_config(cfg(**{"model.block_size": 16}), CONF)
    assert effective_config(cfg(**{"model.block_size": 8}), CONF).model.block_size == 8
    with pytest.raises(TrainerConfigError, match="--model.method: dflash cannot start from "
                                                 "--model.init_from /d/released, a DFlash2"):
        effective_config(cfg(), D2)


@pytest.mark.parametrize("edit,want", [
    (lambda c: c.pop("dflash_config"), "no dflash_config: not a DFlash drafter"),
    (lambda c: c.pop("hidden_size"), "config.json lacks 'hidden_size'"),
    (lambda c: c.update(attention_bias=True), "bias weights"),
    (lambda c: c.update(layer_types=["chunked_attention", FULL]), "layer type 'chunked_attention'"),
    (lambda c: c["dflash_config"].update(block_size="eight"), "malformed DFlash field"),
])
def test_a_drafter_dfo_cannot_train_is_one_line_naming_the_flag(edit, want):
    conf = copy.deepcopy(CONF)
    edit(conf)
    with pytest.raises(TrainerConfigError, match=want) as e:
        effective_config(cfg(), conf)
    assert str(e.value).startswith(f"config: --model.init_from: {DIR}: ") and "\n" not in str(e.value)


def test_without_init_from_the_config_is_untouched():
    c = load_config(None, ["--data.path", "/d/x.jsonl"])
    before = c.to_dict()
    assert effective_config(c, CONF).to_dict() == before


def _reply(state, body=b""):
    line = state if not body else f"{state} {base64.b64encode(body).decode()}"
    return parse_reply(DIR, f"stray line\n{line}\n")


def test_the_hosts_answer_is_parsed_and_a_bad_one_is_one_config_error():
    c = cfg()
    assert c.explicit_keys == {"data.path", "model.init_from"}
    ok = _reply("ok", json.dumps(CONF).encode())
    assert ok == DrafterReply(DIR, "ok", json.dumps(CONF))
    assert effective(c, ok, host="h", config="r.yaml").model.block_size == 8
    assert parse_reply(DIR, "") == DrafterReply(DIR, "none")
    assert parse_reply(DIR, "unreadable base64: x: Permission denied\n").text == \
        "base64: x: Permission denied"
    for reply, want in [
        (_reply("nodir"), f"model.init_from of r.yaml: {DIR} does not exist on h (fix "
                          "model.init_from in r.yaml or pass --set model.init_from=DIR)"),
        (_reply("noconfig"), f"model.init_from of r.yaml on h: --model.init_from: {DIR}: no "
                             "config.json (give an exported DFlash drafter directory)"),
        (_reply("ok", b"{not json"), "config.json is not readable JSON"),
        (_reply("ok", b"\xff\xfe"), "config.json is not readable (not UTF-8 text)"),
        (None, "h gave no answer for /d/released"),
    ]:
        with pytest.raises(ConfigError) as e:
            effective(c, reply, host="h", config="r.yaml")
        assert want in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2
    with pytest.raises(ConfigError, match="--model.block_size: 16 conflicts with the drafter's 8"):
        effective(cfg(**{"model.block_size": 16}), ok, host="h", config="r.yaml")
