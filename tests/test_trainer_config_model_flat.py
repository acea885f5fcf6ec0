"""``ModelConfig``'s flat view (torch-free): ``model.<name>`` is a field of the record or a
method's own setting (``method_settings``), read with ``get_flat``, set with ``set_flat``
(a frozen settings record replaced, never mutated), typed through ``settings_of``; the
record has no ``__getattr__``/``__setattr__``, so the type checker sees every attribute."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig, config_from_dict, load_config
from dfo_contract.trainer_config.flat import clear
from dfo_contract.trainer_config.methods import DFlash2Settings
from dfo_contract.trainer_config.schema import ModelConfig

REPO = Path(__file__).resolve().parent.parent


def test_set_flat_replaces_the_frozen_settings_record():
    m = ModelConfig()
    before = m.settings_of(DFlash2Settings)
    assert before == DFlash2Settings()
    m.set_flat("selector_rank", 8)
    after = m.settings_of(DFlash2Settings)
    assert after is not before and after == replace(before, selector_rank=8)
    assert before.selector_rank == 256                      # the old record is unchanged
    assert m.get_flat("selector_rank") == 8 and m.flat()["selector_rank"] == 8
    assert m.settings() is None                             # dflash, chosen, has none
    m.method = "dflash2"
    assert m.settings() is after


def test_set_flat_sets_a_field_of_the_record():
    m = ModelConfig()
    m.set_flat("block_size", 8)
    assert m.block_size == 8 and m.get_flat("block_size") == 8
    assert m.method_settings == ModelConfig().method_settings


def test_two_configs_share_no_settings_record():
    a, b = ModelConfig(), ModelConfig()
    a.set_flat("conv_kernel_size", 3)
    assert b.settings_of(DFlash2Settings).conv_kernel_size == 2
    c = copy.deepcopy(a)
    c.set_flat("conv_kernel_size", 4)
    assert a.get_flat("conv_kernel_size") == 3 and c.get_flat("conv_kernel_size") == 4


@pytest.mark.parametrize("name", ["blocksize", "method_settings", "_own", "settings"])
def test_an_unknown_flat_name_is_an_attribute_error(name):
    m = ModelConfig()
    why = re.escape(f"'ModelConfig' object has no attribute {name!r}")
    with pytest.raises(AttributeError, match=why):
        m.get_flat(name)
    with pytest.raises(AttributeError, match=why):
        m.set_flat(name, 1)
    assert m == ModelConfig()


def test_an_unknown_key_is_the_config_error_naming_the_known_ones():
    with pytest.raises(TrainerConfigError, match=r"^config: unknown key 'model\.blocksize' "
                                                 r"\(known: model\.attention, .*model\.selector_rank"):
        load_config(None, ["--data.path", "x", "--model.blocksize", "8"])
    with pytest.raises(AttributeError, match="'TrainConfig' object has no attribute 'lrr'"):
        TrainerConfig().set_key("train.lrr", 1.0)


def test_keys_read_and_set_through_the_config():
    cfg = TrainerConfig()
    cfg.set_key("model.selector_top_k", 4)
    cfg.set_key("train.lr", 1e-3)
    assert (cfg.get_key("model.selector_top_k"), cfg.get_key("train.lr")) == (4, 1e-3)
    assert cfg.to_dict()["model"]["selector_top_k"] == 4


def test_clear_puts_a_method_setting_back_at_its_default():
    cfg = load_config(None, ["--data.path", "x", "--model.method", "dflash2",
                             "--model.selector_rank", "8"])
    assert "model.selector_rank" in cfg.explicit_keys
    clear(cfg, "model.selector_rank")
    assert cfg.model.settings() == DFlash2Settings()
    assert "model.selector_rank" not in cfg.explicit_keys
    assert config_from_dict(cfg.to_dict()).model.method_settings == cfg.model.method_settings


def test_settings_of_an_unregistered_class_is_a_key_error():
    class Other:
        pass

    with pytest.raises(KeyError, match="no registered method has the settings Other"):
        ModelConfig().settings_of(Other)


def test_the_record_has_no_attribute_hooks():
    assert "__getattr__" not in vars(ModelConfig) and "__setattr__" not in vars(ModelConfig)


SNIPPET = '''\
from dfo_contract.trainer_config.methods import DFlash2Settings
from dfo_contract.trainer_config.schema import ModelConfig


def reads(m: ModelConfig) -> int:
    return m.blocksize + m.block_size


def writes(m: ModelConfig) -> None:
    m.selector_rank = 8


def typed(m: ModelConfig) -> str:
    return m.settings_of(DFlash2Settings).selector_rank
'''


def test_the_type_checker_rejects_an_unknown_attribute(tmp_path):
    """mypy, as tests/test_static_checks.py runs it (the repository's configuration), on a
    snippet: an unknown attribute read or set is an error, and ``settings_of`` is typed."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null",
                        "--follow-imports", "silent", str(snippet)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "No module named mypy" not in r.stderr, r.stderr
    found = sorted(re.findall(r"snippet\.py:(\d+): error: .*\[([a-z-]+)\]$", r.stdout, re.M))
    assert found == [("10", "attr-defined"), ("14", "return-value"), ("6", "attr-defined")], \
        r.stdout + r.stderr
    assert '"ModelConfig" has no attribute "blocksize"' in r.stdout
    assert '"ModelConfig" has no attribute "selector_rank"' in r.stdout
    assert 'got "int", expected "str"' in r.stdout
