"""common.verdict: the one ladder choice (pure), and `dfo diagnose` on a log alone."""

from __future__ import annotations

import json

from dfo_contract.own_ladder import LadderStep
from orchestrator.cli import main
from orchestrator.common.fallback import DEFAULT_LADDERS, next_config
from orchestrator.common.verdict import RETRY_NOTE, Ladders, choose, position_before


def test_bundled_choice_is_the_ladder_over_the_runs_own_config():
    off = Ladders.assumed({"compile.gate": False, "parallel.layout": "threads"})
    on = Ladders.assumed({"compile.gate": True, "parallel.layout": "threads"})
    assert choose(off, "fx_trace_race", 0, {}).step == "compile_gate"
    assert choose(on, "fx_trace_race", 0, {}).step == "layout_ddp"
    want = next_config("oom", DEFAULT_LADDERS["oom"], 0, {"train.micro_batch": 4}, {})
    got = choose(Ladders.assumed({"train.micro_batch": 4}), "oom", 0, {})
    assert (got.step, got.overrides, got.position) == (want.step, want.overrides, want.position)


def test_position_is_replayed_from_the_earlier_fallbacks():
    lad = Ladders.assumed({"compile.gate": False, "parallel.layout": "threads"})
    pos = position_before(lad, "fx_trace_race", [("fx_trace_race", {}), ("oom", {})])
    c = choose(lad, "fx_trace_race", pos, {"compile.gate": True})
    assert pos == 2 and c.step == "layout_ddp"  # past target_compile_off (skipped) and compile_gate


def test_an_own_race_class_without_a_ladder_restarts_unchanged():
    own = Ladders(own=True, own_steps={"oom": (LadderStep(set_arg={"--batch": "1"}),)})
    for cls in ("fx_trace_race", "compile_hang"):
        c = choose(own, cls, 0, {})
        assert not c.exhausted and c.step is None and c.note == RETRY_NOTE
    assert choose(own, "dense_fallback", 0, {}).exhausted
    assert choose(own, "crash", 0, {}).note == ""       # transient anyway: no note
    c = choose(own, "oom", 0, {})
    assert c.step == "set --batch 1" and choose(own, "oom", c.position, c.overrides).exhausted


def test_a_silent_log_alone_says_what_it_cannot_know(tmp_path, capsys):
    log = tmp_path / "attempt.log"
    log.write_text('@dfo {"kind": "phase", "phase": "compile"}\ncompiling flex_attention\n')
    assert main(["diagnose", "--json", str(log)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fallback"] is None and "cannot be told from a hang" in d["unknown"]
    assert d["alternatives"]["crash"]["step"] is None
    assert d["alternatives"]["compile_hang"]["step"]
    # an exit code given: nothing unknown
    assert main(["diagnose", "--json", "--exit-code", "1", str(log)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unknown"] is None and d["fallback"]["class"] == "crash"
