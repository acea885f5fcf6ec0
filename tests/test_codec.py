"""``dfo_contract.codec``: the one codec of the records that cross a process (round trips,
the NaN rule, missing and unknown fields, tolerant reads) and an old state.json that still
reads through it, key for key."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping

import pytest

from dfo_contract import events as ev
from dfo_contract import runstate as rs
from dfo_contract.codec import Tagged, decode, encode, filtered, flag, flat, named, opt, req
from dfo_contract.errors import ContractError
from dfo_contract.state_records import (BudgetState, CheckpointRef, EvidenceLine,
                                        FallbackRecord, ThroughputLowState)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, kw_only=True)
class Inner:
    step: int
    rate: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    cls: str = req(json="class")
    inner: Inner | None = None
    items: list[Inner] = field(default_factory=list)
    by_name: dict[str, Inner] = field(default_factory=dict)
    pair: tuple[int, ...] = ()
    color: Color = Color.RED
    mode: Literal["a", "b"] = "a"
    note: str | None = opt()
    label: str = named("the-label", "")


@dataclass(kw_only=True)
class Open:
    n: int
    extra: dict[str, Any] = field(default_factory=dict)


def test_round_trip_of_nested_records():
    o = Outer(name="x", cls="oom", inner=Inner(step=3, rate=1.5),
              items=[Inner(step=1), Inner(step=2, rate=2.0)], by_name={"k": Inner(step=4)},
              pair=(1, 2), color=Color.BLUE, mode="b", note="n", label="l")
    d = encode(o)
    assert d == {"name": "x", "class": "oom", "inner": {"step": 3, "rate": 1.5},
                 "items": [{"step": 1, "rate": 0.0}, {"step": 2, "rate": 2.0}],
                 "by_name": {"k": {"step": 4, "rate": 0.0}}, "pair": [1, 2], "color": "blue",
                 "mode": "b", "note": "n", "the-label": "l"}
    assert decode(Outer, json.loads(json.dumps(d))) == o
    # an opt() field that is None is not written; a plain one is written as null
    assert "note" not in encode(Outer(name="x", cls="c"))
    assert encode(Outer(name="x", cls="c"))["inner"] is None


def test_non_finite_floats_are_strings_on_disk_and_floats_in_memory():
    d = encode(Inner(step=1, rate=float("nan")))
    assert d == {"step": 1, "rate": "nan"}
    json.dumps(d, allow_nan=False)   # strict JSON
    assert math.isnan(decode(Inner, d).rate)
    assert decode(Inner, {"step": 1, "rate": "-inf"}).rate == float("-inf")
    assert encode({"a": [float("inf")]}) == {"a": ["inf"]}
    with pytest.raises(ContractError, match="'rate' is str 'fast', expected float"):
        decode(Inner, {"step": 1, "rate": "fast"})


@dataclass(frozen=True, kw_only=True)
class Plotted:
    """A record whose non-finite floats are written as null, everything nested in it too."""
    NONFINITE: ClassVar[str] = "null"
    loss: float | None = None
    inner: Inner | None = None
    curve: tuple[float, ...] = ()
    spelled: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Spelled:
    """A record that keeps the strings, also inside a record that writes null."""
    NONFINITE: ClassVar[str] = "string"
    rate: float = 0.0


def test_a_record_that_says_so_writes_non_finite_floats_as_null():
    nan, inf = float("nan"), float("inf")
    p = Plotted(loss=nan, inner=Inner(step=1, rate=-inf), curve=(0.5, inf),
                spelled=Spelled(rate=nan), extra={"grad": nan, "deep": {"x": [nan]}})
    d = encode(p)
    assert d == {"grad": None, "deep": {"x": [None]}, "loss": None,
                 "inner": {"step": 1, "rate": None}, "curve": [0.5, None],
                 "spelled": {"rate": "nan"}}
    json.dumps(d, allow_nan=False)
    assert encode(Inner(step=1, rate=nan)) == {"step": 1, "rate": "nan"}   # alone: strings
    # reading: a float field reads the strings, and null where it admits None
    back = decode(Plotted, {"loss": "inf", "curve": [1, "-inf"]})
    assert back.loss == inf and back.curve == (1.0, -inf)
    assert decode(Plotted, {"loss": None}).loss is None
    assert math.isnan(decode(Plotted, json.loads('{"loss": NaN}')).loss or 0.0)
    with pytest.raises(ContractError, match="'rate' is NoneType"):
        decode(Inner, {"step": 1, "rate": None})

    @dataclass
    class Odd:
        NONFINITE: ClassVar[str] = "zero"
        x: float = 0.0
    with pytest.raises(TypeError, match="Odd.NONFINITE is 'zero'"):
        encode(Odd(x=nan))


@dataclass(frozen=True, kw_only=True)
class Sifted:
    curve: tuple[float, ...] = filtered(())
    names: list[str] = filtered(factory=list)
    by: dict[str, Inner] = filtered(factory=dict)
    maybe: tuple[int, ...] | None = filtered(None)
    strict: tuple[float, ...] = ()


def test_a_filtered_field_leaves_out_the_items_not_of_its_type():
    got = decode(Sifted, {"curve": [0.5, None, "x", True, 1, "nan"], "names": ["a", 1, "b"],
                          "by": {"ok": {"step": 1}, "bad": {"rate": 1.0}, "no": 3},
                          "maybe": [1, "2", 3]})
    assert got.curve[:2] == (0.5, 1.0) and math.isnan(got.curve[2]) and len(got.curve) == 3
    assert got.names == ["a", "b"] and got.by == {"ok": Inner(step=1)} and got.maybe == (1, 3)
    assert decode(Sifted, {"maybe": None}).maybe is None
    # a field that is not a list at all is still mistyped; an unfiltered one refuses an item
    with pytest.raises(ContractError, match="'curve' is str"):
        decode(Sifted, {"curve": "x"})
    assert decode(Sifted, {"curve": "x"}, tolerant=True).curve == ()
    with pytest.raises(ContractError, match="'strict' is list"):
        decode(Sifted, {"strict": [1.0, None]})
    assert encode(got)["names"] == ["a", "b"]                 # writing is unchanged


@dataclass(frozen=True, kw_only=True)
class Ordered:
    step: int
    extra: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Numeric:
    step: int
    extra: tuple[tuple[str, float], ...] = filtered(())


@dataclass(frozen=True, kw_only=True)
class NumericMap:
    step: int
    extra: dict[str, int] = filtered(factory=dict)


def test_an_extra_of_pairs_keeps_the_order_and_a_filtered_one_its_type():
    obj = {"b": [1], "step": 2, "a": "x", "c": 1}
    o = decode(Ordered, obj)
    assert o.extra == (("b", [1]), ("a", "x"), ("c", 1))
    assert list(encode(o).items()) == [("b", [1]), ("a", "x"), ("c", 1), ("step", 2)]
    n = decode(Numeric, {**obj, "d": 2.5, "e": None, "f": True, "g": "-inf"})
    assert n.extra[:2] == (("c", 1.0), ("d", 2.5)) and n.extra[2] == ("g", float("-inf"))
    assert decode(NumericMap, {**obj, "d": 2.5}).extra == {"c": 1}
    assert decode(Open, {"n": 1, "x": "y"}).extra == {"x": "y"}   # unfiltered: unchecked


def test_missing_and_unknown_fields():
    # missing with a default: the default; missing without one: one line naming it
    assert decode(Outer, {"name": "x", "class": "c"}).items == []
    with pytest.raises(ContractError, match="lacks its 'class' field"):
        decode(Outer, {"name": "x"})
    # unknown keys: ignored by a record without ``extra``; kept (and written first) by one with
    assert decode(Inner, {"step": 1, "newer": True}) == Inner(step=1)
    o = decode(Open, {"n": 1, "newer": [1]})
    assert o.extra == {"newer": [1]} and encode(o) == {"newer": [1], "n": 1}
    # a mistyped field, a wrong enum or Literal, a non-object
    for bad in ({"name": 1, "class": "c"}, {"name": "x", "class": "c", "color": "green"},
                {"name": "x", "class": "c", "mode": "z"},
                {"name": "x", "class": "c", "items": [{"step": "1"}]}):
        with pytest.raises(ContractError):
            decode(Outer, bad)
    with pytest.raises(ContractError, match="is not a JSON object"):
        decode(Inner, [1])
    assert decode(Inner, {"rate": 2}, step=7) == Inner(step=7, rate=2.0)   # defaults fill


def test_a_tolerant_read_defaults_mistyped_fields_only():
    assert decode(Inner, {"step": 1, "rate": "fast"}, tolerant=True).rate == 0.0
    with pytest.raises(ContractError):                      # no default: still refused
        decode(Inner, {"step": "one"}, tolerant=True)
    assert decode(Inner, {"step": "one"}, tolerant=True, step=-1).step == -1   # unless given
    with pytest.raises(ContractError):                      # a nested record lacking a field
        decode(Outer, {"name": "x", "class": "c", "items": [{"rate": 1}]}, tolerant=True)


def test_events_read_and_write_through_the_codec():
    e = ev.Final(t=5.0, status="done", reason="r",
                 last_checkpoint=CheckpointRef(step=4, path="/c/step_4"), goodput=float("nan"))
    line = ev.encode_line(e)
    obj = json.loads(line)
    assert obj["last_checkpoint"] == {"step": 4, "path": "/c/step_4"} and obj["goodput"] == "nan"
    back = ev.decode(line)
    assert isinstance(back, ev.Final) and back.last_checkpoint == e.last_checkpoint
    assert math.isnan(back.goodput or 0.0)


#: a state.json as the supervisor before the typed sub-records wrote it
OLD_STATE = {
    "run_id": "tiny-cpu-20261201-010000-0a1b2c", "run_name": "tiny-cpu", "version": 1,
    "status": "running", "reason": None,
    "evidence": [{"line": 3, "text": "RuntimeError: CUDA out of memory", "rule": "oom"}],
    "pid": 41, "mode": "setsid", "started_at": 10.0, "updated_at": 20.5, "ended_at": None,
    "attempt": 3,
    "attempts": [{"n": 1, "started_at": 10.5, "ended_at": 12.0, "resume": None,
                  "overrides": {}, "argv": ["python"], "log": "attempt-1.log", "pid": 42,
                  "exit_code": 1, "signal": None, "cls": "oom", "reason": "CUDA OOM",
                  "reached_train": True, "checkpointed": False, "cache_grew": None,
                  "from_a_newer_supervisor": 1}],
    "overrides": {"train.micro_batch": 4},
    "fallbacks": [{"class": "oom", "step": "halve_micro_batch",
                   "changed": {"train.micro_batch": 4}, "attempt": 1},
                  {"class": "fx_trace_race", "step": "restart unchanged", "note": "a race",
                   "changed": {}, "attempt": 2}],
    "ladder_pos": {"oom": 1},
    "budget": {"counts": {"oom": 1}, "total": 2, "streak": 2, "startup_streak": 0},
    "last_step": 40, "tokens_per_s": "nan", "baseline_tokens_per_s": 1200.0,
    "baseline_overrides": {}, "last_startup_failure_overrides": None,
    "last_checkpoint": {"step": 30, "path": "/root/dfo/checkpoints/tiny-cpu/step_30"},
    "accept_len": None, "best_accept_len": None,
    "throughput_low": {"cause": "host_busy", "summary": "4 CPU hogs", "since": 19.0,
                       "attempt": 3, "reason": "tokens/s fell"},
    "trainer_pids": [43], "standby_pid": None, "last_event": "checkpoint step 30",
    "a_key_of_a_newer_supervisor": {"x": 1},
}


def test_an_old_state_json_reads_typed_and_writes_back_key_for_key():
    st = rs.RunState.from_json(json.loads(json.dumps(OLD_STATE)))
    assert st.last_checkpoint == CheckpointRef(step=30, path="/root/dfo/checkpoints/tiny-cpu/step_30")
    assert st.fallbacks == [
        FallbackRecord(cls="oom", step="halve_micro_batch", changed={"train.micro_batch": 4},
                       attempt=1),
        FallbackRecord(cls="fx_trace_race", step="restart unchanged", note="a race",
                       attempt=2)]
    assert st.throughput_low == ThroughputLowState(cause="host_busy", summary="4 CPU hogs",
                                                   since=19.0, attempt=3,
                                                   reason="tokens/s fell")
    assert st.budget == BudgetState(counts={"oom": 1}, total=2, streak=2)
    assert st.evidence == [EvidenceLine(line=3, text="RuntimeError: CUDA out of memory",
                                        rule="oom")]
    assert st.ladder_pos == {"oom": 1} and math.isnan(st.tokens_per_s or 0.0)
    assert st.attempts[0].extra == {"from_a_newer_supervisor": 1}
    assert st.extra == {"a_key_of_a_newer_supervisor": {"x": 1}}
    assert json.dumps(st.to_json(), sort_keys=True) == json.dumps(OLD_STATE, sort_keys=True)


def test_a_fresh_state_has_the_keys_an_old_reader_expects():
    d = rs.RunState.new("r", "r", now=1.0).to_json()
    assert d["budget"] == {"counts": {}, "total": 0, "streak": 0, "startup_streak": 0}
    assert d["fallbacks"] == [] and d["last_checkpoint"] is None and d["ladder_pos"] == {}
    assert rs.RunState.from_json(d) == rs.RunState.new("r", "r", now=1.0)


@dataclass(frozen=True)
class Kept:
    step: int
    rate: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Beside:
    """A record read tolerant wherever it is (its class says so), its nested one with it."""

    TOLERANT = True

    kept: Kept = flat()
    live: bool = False
    version: int = named("beside_version", 1)


@dataclass(frozen=True)
class Envelope:
    items: tuple[Beside, ...] = ()


def test_a_flat_record_sits_beside_the_records_keys_and_keeps_what_nobody_knows():
    b = Beside(Kept(step=3, rate=0.5, extra={"newer": [1]}), live=True)
    obj = encode(b)
    assert obj == {"newer": [1], "step": 3, "rate": 0.5, "live": True, "beside_version": 1}
    assert list(obj)[-2:] == ["live", "beside_version"]      # the nested keys come first
    assert decode(Beside, json.loads(json.dumps(obj))) == b
    with pytest.raises(ContractError, match="lacks its 'step'"):
        decode(Beside, {"live": True})


def test_a_tolerant_class_is_read_tolerant_inside_a_strict_record():
    env = decode(Envelope, {"items": [{"step": 1, "rate": "fast", "live": "yes"}]})
    assert env.items[0] == Beside(Kept(step=1, rate=0.0), live=False)
    with pytest.raises(ContractError):                  # the strict envelope still refuses
        decode(Envelope, {"items": {"step": 1}})
    with pytest.raises(ContractError):                  # and a missing required field
        decode(Envelope, {"items": [{"rate": 1.0}]})


@dataclass(frozen=True, kw_only=True)
class Cat(Tagged):
    kind: ClassVar[str] = "cat"
    lives: int = 9


@dataclass(frozen=True, kw_only=True)
class Dog(Tagged):
    kind: ClassVar[str] = "dog"
    tricks: tuple[str, ...] = ()
    toys: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Home:
    pet: Cat | Dog
    spare: Cat | Dog | None = None


def test_a_tagged_record_is_written_kind_first_and_read_by_its_kind():
    h = Home(pet=Dog(tricks=("sit",), toys={"ball": ({"red": 1},)}))
    d = encode(h)
    assert list(d["pet"]) == ["kind", "tricks", "toys"] and d["pet"]["kind"] == "dog"
    assert d["pet"]["toys"] == {"ball": [{"red": 1}]} and d["spare"] is None
    back = decode(Home, json.loads(json.dumps(d)))
    assert back == h and isinstance(back.pet.tricks, tuple)
    assert decode(Home, {"pet": {"kind": "cat"}}).pet == Cat()
    for pet, needle in (({"kind": "cow"}, "'pet.kind' is 'cow', expected one of cat, dog"),
                        ({"lives": 3}, "'pet.kind' is None, expected one of cat, dog"),
                        ({"kind": "cat", "lives": "x"}, "'pet.lives' is str")):
        with pytest.raises(ContractError, match=needle):
            decode(Home, {"pet": pet})
    with pytest.raises(ContractError, match="'kind' is 'dog', expected 'cat'"):
        decode(Cat, {"kind": "dog"})
    assert encode(Cat(), skip=("kind",)) == {"lives": 9}
    # an event's kind is its envelope's: events are not tagged records
    assert "kind" not in ev.Checkpoint(attempt=1, step=2, path="/c").body()


def test_an_error_names_the_place_from_the_record_down():
    from dfo_contract.runstate import RunState
    with pytest.raises(ContractError) as e:
        RunState.from_json({"run_id": "x", "attempts": [{"n": 1, "started_at": 1.0},
                                                        {"started_at": 2.0}]})
    assert str(e.value) == "state.json's 'attempts[1]' lacks its 'n' field"
    with pytest.raises(ContractError) as e:
        decode(Home, {"pet": {"kind": "cat", "lives": "x"}}, what="home.json")
    assert str(e.value).startswith("home.json's 'pet.lives' is str 'x'")


@dataclass(frozen=True)
class Flagged:
    n: int
    again: bool = flag(json="r")


def test_a_flag_is_written_as_one_when_true_and_left_out_when_false():
    assert encode(Flagged(1)) == {"n": 1}
    assert encode(Flagged(1, again=True)) == {"n": 1, "r": 1}
    for raw, again in (({"n": 1}, False), ({"n": 1, "r": 1}, True), ({"n": 1, "r": True}, True),
                       ({"n": 1, "r": 0}, False), ({"n": 1, "r": None}, False)):
        assert decode(Flagged, raw) == Flagged(1, again=again)
    with pytest.raises(ContractError, match="'r' is str 'yes', expected bool or int or null"):
        decode(Flagged, {"n": 1, "r": "yes"}, what="a flagged record")
