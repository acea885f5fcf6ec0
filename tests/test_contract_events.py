"""dfo_contract.events: every kind round-trips, files
without ``v`` read, newer versions are refused.

The recorded sample (tests/fixtures/events/recorded.jsonl) is real ``events.jsonl`` text
from supervised runs (GPU recovery, your own trainer, the standby interpreter), written
before records carried ``v``; synthetic.jsonl covers the remaining kinds in the same
format. ``*.described.txt`` is each record's line as ``dfo logs`` / ``dfo status`` showed
it then: the typed events must describe themselves identically.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfo_contract import events as ev
from dfo_contract.errors import ContractError, NotARecord, VersionError
from dfo_contract.events.base import json_name
from dfo_contract.state_records import EvidenceLine

FIXTURES = Path(__file__).parent / "fixtures" / "events"
SAMPLES = ("recorded", "synthetic")

_text = st.text(max_size=12)


def _dicts(values):
    # written with sorted keys: a dict read back is in key order, so generate it so
    return st.dictionaries(_text, values, max_size=3).map(lambda d: dict(sorted(d.items())))


_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
                     lambda c: st.lists(c, max_size=3) | _dicts(c), max_leaves=6)


def _strategy(hint):
    """Values of a field's type (finite floats: NaN never equals itself)."""
    if hint is typing.Any:
        return _json
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_strategy(a) for a in typing.get_args(hint)))
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-2**40, 2**40)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=32)
    if hint is str:
        return _text
    if origin is list:
        return st.lists(_strategy(typing.get_args(hint)[0]), max_size=3)
    if origin is tuple:                  # tuple[X, ...]
        return st.lists(_strategy(typing.get_args(hint)[0]), max_size=3).map(tuple)
    if origin is dict:
        return _dicts(_strategy(typing.get_args(hint)[1]))
    if dataclasses.is_dataclass(hint):   # a nested record (CheckpointRef, NodeOutcome, ...)
        return _event_of(hint)
    raise AssertionError(f"no strategy for {hint!r}")


def _event_of(cls):
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: _strategy(hints[f.name]) for f in fields(cls)})


_any_event = st.one_of(*(_event_of(c) for c in ev.REGISTRY.values()))


def _lines(name: str, ext: str) -> list[str]:
    return (FIXTURES / f"{name}.{ext}").read_text().splitlines()


# --- round trips ------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(_any_event)
def test_every_kind_round_trips_through_its_line(e):
    line = ev.encode_line(e)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert obj["v"] == ev.VERSION and obj["kind"] == e.kind
    back = ev.decode(line)
    assert back == e and type(back) is type(e)
    assert back.describe() == e.describe() and e.describe()


@settings(max_examples=100, deadline=None)
@given(_any_event)
def test_the_body_round_trips_without_v_t_kind(e):
    body = e.body()
    assert not {"v", "t", "mono", "kind"} & set(body)
    assert type(e).from_body(body, t=e.t, mono=e.mono) == e


def test_the_registry_names_every_kind_once():
    assert len(ev.REGISTRY) == 28 and all(k == c.kind for k, c in ev.REGISTRY.items())
    assert set(typing.get_args(ev.Event)) == set(ev.REGISTRY.values()) | {ev.UnknownEvent}


def test_non_finite_floats_are_strict_json_and_read_back():
    e = ev.ThroughputLow(attempt=1, reason="r", cause="unknown", causes=[], summary="s",
                         seen={"steal": float("nan")})
    obj = json.loads(ev.encode_line(e))
    assert obj["seen"] == {"steal": "nan"}
    d = ev.AttemptEnd(attempt=1, exit_code=None, signal=9, duration_s=float("inf"))
    assert ev.decode(ev.encode_line(d)).duration_s == float("inf")


# --- files without v ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", SAMPLES)
def test_records_written_before_versions_describe_as_they_did(name):
    got = ev.read_events((FIXTURES / f"{name}.jsonl").read_text())
    assert [e.describe() for e in got] == _lines(name, "described.txt")


def _kept(old, new) -> bool:
    """Every value of ``old`` is in ``new``: a null optional field (or a ``cause`` of ``{}``,
    no cause) may drop out, a nested record's fields that ``old`` lacks read as their
    defaults and are written."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(
            _kept(v, new[k]) if k in new else v is None or (k == "cause" and v == {})
            for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(old) == len(new) and all(map(_kept, old, new))
    return old == new


@pytest.mark.parametrize("name", SAMPLES)
def test_old_records_rewrite_to_the_same_object_plus_v(name):
    for line in _lines(name, "jsonl"):
        e = ev.decode(line)
        if isinstance(e, ev.UnknownEvent):
            continue
        old, new = json.loads(line), json.loads(ev.encode_line(e))
        assert new.pop("v") == 1
        assert set(new) <= set(old) and _kept(old, new), line
        assert ev.from_dict(new) == e


#: records as a supervisor wrote them with the evidence lines and the cause as plain objects:
#: a cause of {} (none judged), a fallback and a restart without their t
_PLAIN = """\
{"t":10.0,"kind":"classified","attempt":1,"class":"oom","reason":"torch-oom in the output","evidence":[{"line":3,"rule":"torch-oom","text":"torch.OutOfMemoryError: CUDA out of memory."}],"also":["oom"]}
{"v":1,"t":11.0,"kind":"give_up","class":"oom","reason":"budget spent","evidence":[{"line":null,"rule":null,"text":"x"}]}
{"v":1,"t":12.0,"kind":"node_end","attempt":1,"node":1,"host":"gpu2","class":"oom","reason":"r","exit_code":1,"reached_train":true,"healthy_s":3.5,"permanent":false,"origin":true,"evidence":[{"line":7,"rule":"torch-oom","text":"OutOfMemoryError"}]}
{"v":1,"t":13.0,"kind":"group_decision","attempt":1,"node":1,"host":"gpu2","action":"restart","status":"","reason":"","cause":{"class":"oom","node":1,"host":"gpu2","reason":"r","exit_code":1,"reached_train":true,"healthy_s":3.5,"permanent":false,"origin":true,"evidence":[{"line":7,"rule":"torch-oom","text":"OutOfMemoryError"}],"cache_fault":null,"supervisor_died":false},"overrides":{"train.micro_batch":2},"fallback":{"attempt":1,"class":"oom","step":"halve_micro_batch","changed":{"train.micro_batch":2},"overrides":{"train.micro_batch":2},"restore_cache":false},"restart":{"attempt":2,"delay_s":0.5,"reason":"restart 1/5"},"last_checkpoint":{"step":4,"path":"/c/step_4"},"last_step":5}
{"v":1,"t":14.0,"kind":"group_decision","attempt":2,"node":1,"host":"gpu2","action":"final","status":"failed","reason":"node gpu2 lost","cause":{},"fallback":null,"restart":null,"last_checkpoint":null,"last_step":null}
{"v":1,"t":15.0,"kind":"checkpoint","attempt":2,"step":40,"path":"/c/step_40"}
{"v":1,"t":16.0,"kind":"eval","attempt":2,"step":40,"accept_len":2,"best_accept_len":null}
"""


def test_records_with_plain_evidence_and_cause_read_as_typed_records():
    cl, gu, ne, dec, fin, ck, evl = ev.read_events(_PLAIN)
    oom = EvidenceLine(line=7, text="OutOfMemoryError", rule="torch-oom")
    assert isinstance(cl, ev.Classified) and cl.evidence == [
        EvidenceLine(line=3, text="torch.OutOfMemoryError: CUDA out of memory.", rule="torch-oom")]
    assert isinstance(gu, ev.GiveUp) and gu.evidence == [EvidenceLine(text="x")]
    assert gu.evidence_texts() == ["x"]
    assert isinstance(ne, ev.NodeEnd) and ne.evidence == [oom] and ne.evidence[0].line == 7
    assert isinstance(dec, ev.GroupDecision)
    c = dec.cause
    assert c is not None and (c.cls, c.node, c.host, c.reason) == ("oom", 1, "gpu2", "r")
    assert c.evidence == (oom,) and c.cache_fault is None and not c.supervisor_died
    mirrored = c.event(1)
    assert mirrored == dataclasses.replace(ne, t=mirrored.t)
    assert isinstance(dec.fallback, ev.Fallback) and dec.fallback.t == 0.0
    assert (dec.fallback.cls, dec.fallback.step) == ("oom", "halve_micro_batch")
    assert isinstance(dec.restart, ev.Restart) and dec.restart.attempt == 2
    assert dec.last_checkpoint is not None and dec.last_checkpoint.step == 4
    assert dec.last_step == 5
    assert dec.describe() == "head's decision on attempt 1: restart (cause oom on gpu2)"
    assert isinstance(fin, ev.GroupDecision) and fin.cause is None and fin.fallback is None
    assert fin.last_step is None
    assert isinstance(ck, ev.Checkpoint) and (ck.step, ck.path) == (40, "/c/step_40")
    assert isinstance(evl, ev.Eval) and evl.accept_len == 2.0 and type(evl.accept_len) is float
    assert evl.best_accept_len is None
    # written back, the lines keep their keys: class, evidence's line/text/rule, cause's class
    obj = json.loads(ev.encode_line(dec))
    assert obj["cause"]["class"] == "oom" and obj["cause"]["evidence"] == [
        {"line": 7, "text": "OutOfMemoryError", "rule": "torch-oom"}]
    assert obj["fallback"]["class"] == "oom" and obj["fallback"]["t"] == 0.0
    assert "cause" not in json.loads(ev.encode_line(fin))
    with pytest.raises(ContractError, match="'step' is str"):
        ev.decode('{"v":1,"t":1,"kind":"checkpoint","attempt":1,"step":"40","path":"/c"}')


def test_the_recorded_sample_holds_real_runs():
    kinds = {e.kind for e in ev.read_events((FIXTURES / "recorded.jsonl").read_text())}
    assert {"supervisor_start", "attempt_start", "classified", "fallback", "restart",
            "cache_restore", "standby_used", "run_first", "final"} <= kinds


# --- the reading rules ---------------------------------------------------------------------------

def test_a_newer_version_is_refused_in_one_line():
    line = json.dumps({"v": 2, "t": 1.0, "kind": "checkpoint", "attempt": 1, "step": 3,
                       "path": "/c"})
    with pytest.raises(VersionError) as ei:
        ev.decode(line)
    msg = str(ei.value)
    assert "\n" not in msg and "version 2" in msg and "version 1" in msg
    assert isinstance(ei.value, ContractError) and isinstance(ei.value, ValueError)
    with pytest.raises(VersionError):
        ev.read_events(line + "\n")          # read_events never skips a newer record
    with pytest.raises(ContractError):
        ev.decode('{"v": "1", "kind": "final"}')


def test_an_unknown_kind_of_this_version_reads_and_describes_itself():
    e = ev.decode('{"v": 1, "t": 5, "kind": "gpu_swap", "attempt": 3, "gpu": 1}')
    assert isinstance(e, ev.UnknownEvent) and e.kind == "gpu_swap"
    assert e.describe() == "gpu_swap" and e.t == 5.0
    assert e.fields == {"attempt": 3, "gpu": 1}
    with pytest.raises(ContractError):
        ev.encode_line(e)                    # never written: this dfo does not know it


def test_required_fields_and_types_are_checked_optional_ones_and_extras_tolerated():
    base = {"v": 1, "t": 1.0, "kind": "attempt_end", "attempt": 2, "exit_code": 5,
            "signal": None, "duration_s": 3}
    e = ev.from_dict({**base, "added_by_a_newer_writer": [1]})
    assert e == ev.AttemptEnd(t=1.0, attempt=2, exit_code=5, signal=None, duration_s=3.0)
    assert e.reached_train is None and e.note is None
    with pytest.raises(ContractError, match="lacks its 'duration_s'"):
        ev.from_dict({k: v for k, v in base.items() if k != "duration_s"})
    with pytest.raises(ContractError, match="'exit_code' is str"):
        ev.from_dict({**base, "exit_code": "5"})
    with pytest.raises(ContractError, match="'attempt' is bool"):
        ev.from_dict({**base, "attempt": True})
    with pytest.raises(ContractError):
        ev.from_dict({"v": 1, "t": 1})       # no kind
    f = ev.from_dict({"kind": "fallback", "t": 2, "attempt": 1, "class": "oom", "step": None,
                      "changed": {}, "overrides": {}, "restore_cache": False})
    assert f.cls == "oom" and "class" in f.body() and "cls" not in f.body()
    assert json_name(next(x for x in fields(ev.Fallback) if x.name == "cls")) == "class"


def test_lines_that_are_not_records_are_skipped_by_read_events():
    good = ev.encode_line(ev.Stopping(t=1.0, attempt=1, reason="x")).decode()
    for bad in ("", "not json", "[1, 2]", '{"kind": "stopping", "att'):
        with pytest.raises(NotARecord):
            ev.decode(bad)
    assert ev.read_events("\n".join(["not json", good, "[1]", "", good])) == [
        ev.Stopping(t=1.0, attempt=1, reason="x")] * 2


def test_evidence_texts():
    e = ev.Classified(attempt=1, cls="oom", reason="r", also=[],
                      evidence=[EvidenceLine(line=3, rule="torch-oom", text="OutOfMemoryError")])
    assert e.evidence_texts() == ["OutOfMemoryError"]
    assert ev.Stopping(attempt=1, reason="x").evidence_texts() == []


def test_docs_list_every_kind_with_its_fields():
    import re

    text = (Path(__file__).parents[1] / "docs" / "contracts.md").read_text()
    section = text[text.index("## Events"):text.index("## The follow wire")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$", section,
                                                        re.M)}
    assert set(rows) == set(ev.REGISTRY)
    for kind, cls in ev.REGISTRY.items():
        named = set(re.findall(r"\*?`(\w+)`\*?", rows[kind]))
        optional = set(re.findall(r"\*`(\w+)`\*", rows[kind]))
        fs = [f for f in fields(cls) if f.name not in ("t", "mono")]
        assert named == {json_name(f) for f in fs}, kind
        assert optional == {json_name(f) for f in fs if f.metadata.get("optional")}, kind
