"""Pure unit tests of the fault spec parser (no torch needed)."""

from __future__ import annotations

import pytest

from trainer.telemetry.faults import Fault, FaultSpecError, parse_spec, resolve_spec


def test_empty_is_no_faults():
    assert parse_spec(None) == []
    assert parse_spec("  ") == []


def test_every_kind_parses():
    got = parse_spec("fx_race@5,hang@3#2,oom@1#*,exit=7@4,sigkill@9,slow=0.25@2,nan@6")
    assert got == [
        Fault("fx_race", 5, 1), Fault("hang", 3, 2), Fault("oom", 1, None),
        Fault("exit", 4, 1, 7), Fault("sigkill", 9, 1), Fault("slow", 2, 1, 0.25),
        Fault("nan", 6, 1),
    ]


def test_attempt_defaults_to_first_only():
    f = parse_spec("oom@3")[0]
    assert f.matches(3, 1) and not f.matches(3, 2) and not f.matches(2, 1)
    g = parse_spec("oom@3#*")[0]
    assert g.matches(3, 1) and g.matches(3, 7) and not g.matches(4, 1)
    h = parse_spec("oom@3#2")[0]
    assert h.matches(3, 2) and not h.matches(3, 1)


@pytest.mark.parametrize("spec, needle", [
    ("boom@3", "unknown kind 'boom'"),
    ("oom", "not of the form"),
    ("oom@x", "step must be a non-negative integer"),
    ("oom@-1", "step must be"),
    ("exit@3", "exit needs an argument"),
    ("exit=300@3", "exit code must be an integer 0..255"),
    ("exit=a@3", "exit code must be"),
    ("slow@3", "slow needs an argument"),
    ("slow=1.5@3", "slow fraction must be in (0, 1)"),
    ("slow=0@3", "slow fraction must be in (0, 1)"),
    ("slow=x@3", "slow fraction must be a number"),
    ("oom=2@3", "oom takes no argument"),
    ("oom@3#0", "attempt must be a positive integer or *"),
    ("oom@3#x", "attempt must be"),
    ("oom@3,,nan@4", "empty item"),
])
def test_bad_specs_name_the_item(spec, needle):
    with pytest.raises(FaultSpecError) as ei:
        parse_spec(spec)
    msg = str(ei.value)
    assert needle in msg
    assert msg.startswith("config: --fault.spec:")
    assert "\n" not in msg


def test_str_roundtrips():
    for s in ["fx_race@5#1", "exit=3@2#*", "slow=0.5@1#2"]:
        assert str(parse_spec(s)[0]) == s
        assert parse_spec(str(parse_spec(s)[0])) == parse_spec(s)


def test_flag_wins_over_env(monkeypatch):
    monkeypatch.setenv("DFO_FAULT", "oom@1")
    assert resolve_spec(None) == "oom@1"
    assert resolve_spec("") == "oom@1"
    assert resolve_spec("nan@2") == "nan@2"
    monkeypatch.delenv("DFO_FAULT")
    assert resolve_spec(None) is None
