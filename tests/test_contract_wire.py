"""dfo_contract.wire: the follow records round-trip, stray lines are not records, a newer
version is refused, and the on-wire shape is the one the follower always sent."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfo_contract import wire
from dfo_contract.errors import ContractError, VersionError

_records = st.one_of(
    st.builds(wire.Line, st.text(max_size=20), st.integers(0, 2**50), st.text(max_size=60)),
    st.builds(wire.End, st.text(max_size=12)),
    st.builds(wire.Eof, st.none() | st.text(max_size=12)),
    st.just(wire.Keepalive()),
    st.builds(wire.Error, st.text(max_size=30)),
)


@settings(max_examples=200, deadline=None)
@given(_records)
def test_every_record_round_trips_on_one_line(rec):
    line = wire.encode(rec)
    assert "\n" not in line
    assert wire.decode(line) == rec


def test_the_shape_on_the_wire():
    assert json.loads(wire.encode(wire.Line("attempt-2.log", 1234, "text"))) == {
        "f": "attempt-2.log", "o": 1234, "l": "text"}
    assert wire.encode(wire.End(wire.NEVER_STARTED)) == '{"end":"never_started"}'
    assert json.loads(wire.encode(wire.Eof(None))) == {"eof": True, "status": None}
    assert wire.encode(wire.Keepalive()) == '{"k":1}'
    assert json.loads(wire.encode(wire.Error("no run directory /x"))) == {
        "error": "no run directory /x"}


def test_lines_that_are_not_records_decode_as_none():
    for stray in ("Traceback (most recent call last):", '{"f": "a.log", "o": "x"}',
                  '{"f": "a.log"}', "[1]", '{"new_record": 1}', '{"end": "do'):
        assert wire.decode(stray) is None


def test_a_newer_version_is_refused():
    with pytest.raises(VersionError, match="version 2"):
        wire.decode('{"v": 2, "f": "a.log", "o": 1, "l": "x"}')
    assert wire.decode('{"v": 1, "k": 1}') == wire.Keepalive()


def test_offsets_argument():
    assert wire.decode_offsets(wire.encode_offsets({"a.log": 3, "events.jsonl": 7})) == {
        "a.log": 3, "events.jsonl": 7}
    assert wire.encode_offsets({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    for bad in ("[1]", "{", '{"a": "x"}'):
        with pytest.raises(ContractError):
            wire.decode_offsets(bad)
