"""Fallback ladders: pure steps, skipping, repetition, validation."""

from __future__ import annotations

import pytest

from orchestrator.common.errors import ConfigError
from orchestrator.common.fallback import (DEFAULT_LADDERS, STEPS, describe, merge_ladders,
                                       next_config, validate_ladders)

# the threaded lazy-compile race's config (docs/recovery.md)
RACE = {"compile.gate": False, "parallel.layout": "threads",
            "parallel.drafter_devices": ["cuda:0", "cuda:1", "cuda:2"], "model.attention": "flex",
            "train.micro_batch": 8, "data.num_anchors": 512, "train.lr": 6e-4}


def walk(cls, base, n):
    ladder = DEFAULT_LADDERS[cls]
    pos, ov, steps = 0, {}, []
    for _ in range(n):
        c = next_config(cls, ladder, pos, base, ov)
        steps.append(c)
        pos, ov = c.position, c.overrides
    return steps


def test_fx_ladder_walks_the_race_config_in_order():
    s = walk("fx_trace_race", RACE, 5)
    assert [c.step for c in s[:4]] == ["compile_gate", "layout_ddp", "one_drafter_device",
                                      "attention_sdpa"]
    assert s[0].changed == {"compile.gate": True} and s[0].restore_cache
    assert s[2].changed == {"parallel.drafter_devices": ["cuda:0"]}
    assert s[3].overrides == {"compile.gate": True, "parallel.layout": "ddp",
                              "parallel.drafter_devices": ["cuda:0"], "model.attention": "sdpa"}
    assert s[4].exhausted and s[4].step is None


def test_steps_that_change_nothing_are_skipped():
    base = dict(RACE, **{"compile.gate": True, "parallel.drafter_devices": ["cuda:0"]})
    s = walk("compile_hang", base, 3)
    assert [c.step for c in s[:2]] == ["layout_ddp", "attention_sdpa"]
    assert s[2].exhausted


def test_a_compile_step_is_skipped_when_the_run_does_not_compile():
    base = dict(RACE, **{"compile.enabled": False})
    s = walk("compile_hang", base, 2)
    assert s[0].step == "layout_ddp" and "compile.gate" not in s[0].overrides
    assert not s[0].restore_cache
    assert walk("compile_hang", dict(RACE, **{"compile.enabled": True}), 1)[0].step == "compile_gate"


def test_oom_halves_micro_batch_then_anchors():
    base = dict(RACE, **{"train.micro_batch": 4, "data.num_anchors": 4})
    s = walk("oom", base, 6)
    assert [c.changed for c in s[:4]] == [{"train.micro_batch": 2}, {"train.micro_batch": 1},
                                         {"data.num_anchors": 2}, {"data.num_anchors": 1}]
    assert s[4].exhausted


def test_transient_classes_restart_with_same_config():
    for cls in ("crash", "nccl_timeout", "frozen"):
        c = next_config(cls, DEFAULT_LADDERS[cls], 0, RACE, {"a.b": 1})
        assert c.step is None and not c.exhausted and c.overrides == {"a.b": 1}


def test_steps_are_pure():
    ov = {"x.y": 1}
    for name, fn in STEPS.items():
        before = dict(ov)
        fn(dict(RACE), ov)
        assert ov == before, name


def test_validate_ladders_accepts_and_rejects():
    assert validate_ladders({"oom": ["halve_anchors*"], "crash": "same, halve_lr"}) == \
        {"oom": ["halve_anchors*"], "crash": ["same", "halve_lr"]}
    with pytest.raises(ConfigError, match="unknown fallback step 'ddp'.*layout_ddp"):
        validate_ladders({"fx_trace_race": ["ddp"]}, source="hosts.yaml: hosts.pve.fallbacks")
    with pytest.raises(ConfigError, match="unknown failure class 'fx'"):
        validate_ladders({"fx": ["same"]})
    with pytest.raises(ConfigError):
        validate_ladders(["same"])


def test_merge_replaces_whole_classes_and_describe():
    m = merge_ladders({"oom": ["halve_anchors"]})
    assert m["oom"] == ["halve_anchors"] and m["fx_trace_race"] == DEFAULT_LADDERS["fx_trace_race"]
    rows = dict(describe(m))
    assert rows["fx_trace_race"].startswith("target_compile_off -> compile_gate -> layout_ddp")
    assert rows["crash"].endswith("restart with the same config")
