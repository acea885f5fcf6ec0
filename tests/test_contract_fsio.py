"""dfo_contract.fsio's JSON-lines files and directory replacement, on real files: a torn
last line or damaged bytes are skipped and counted, never an error; concurrent appends
never mix; a replaced directory is the old one or the new one, never neither."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from dfo_contract import fsio


def test_parse_jsonl_skips_and_counts_what_is_not_an_object():
    data = (b'{"step": 1}\n'
            b'\n'                                   # blank: neither a record nor skipped
            b'{"step": 2, "name": "\xc3\xbc"}\r\n'
            b'{"step": \xff\xfe}\n'                 # invalid bytes
            b'[1, 2]\n'                             # JSON, not an object
            b'Traceback (most recent call last):\n'  # text that is no record
            b'{"step": 3, "loss": 0.')              # torn: the writer was cut off
    got = fsio.parse_jsonl(data)
    assert got.records == [{"step": 1}, {"step": 2, "name": "ü"}]
    assert got.skipped == 4
    assert fsio.parse_jsonl(data.decode("utf-8", "replace")).records == got.records
    assert fsio.parse_jsonl("") == fsio.JsonLines([], 0)


def test_json_object_of_one_line():
    assert fsio.json_object('{"a": 1}') == {"a": 1} and fsio.json_object(b' {"a": 1}\n') == {"a": 1}
    for line in ("[1]", '"x"', "null", '{"a": ', b'{"a": "\xff"}', "", "warning: x"):
        assert fsio.json_object(line) is None, line


def test_parse_jsonl_keeps_a_line_separator_inside_a_string():
    """U+2028 is a line break to str.splitlines, not to JSON lines."""
    text = json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n"
    assert fsio.parse_jsonl(text).records == [{"text": "a\u2028b"}]


def test_read_jsonl_whole_and_tail(tmp_path):
    p = tmp_path / "metrics.jsonl"
    for i in range(200):
        fsio.append_jsonl(p, {"step": i, "tokens_per_s": 10.0 * i})
    whole = fsio.read_jsonl(p)
    assert [r["step"] for r in whole.records] == list(range(200)) and whole.skipped == 0
    tail = fsio.read_jsonl(p, tail_bytes=300)
    assert tail.skipped == 0                  # the line the tail starts inside is dropped
    steps = [r["step"] for r in tail.records]
    assert steps and steps == list(range(200 - len(steps), 200))
    assert len(b"".join(p.read_bytes().splitlines(keepends=True)[-len(steps):])) <= 300
    assert fsio.read_jsonl(p, tail_bytes=10 ** 6).records == whole.records
    with open(p, "ab") as f:
        f.write(b'{"step": 200, "tok')             # a crash mid-append
    torn = fsio.read_jsonl(p)
    assert len(torn.records) == 200 and torn.skipped == 1


def test_append_jsonl_is_strict_json(tmp_path):
    p = tmp_path / "m.jsonl"
    with pytest.raises(ValueError):
        fsio.append_jsonl(p, {"loss": float("nan")})
    assert not p.exists() or p.read_bytes() == b""
    assert fsio.jsonl_line({"a": "ü"}) == b'{"a": "\\u00fc"}\n'


def _append_many(path: str, writer: int, n: int) -> None:
    for i in range(n):
        fsio.append_jsonl(path, {"writer": writer, "i": i, "pad": "x" * (i % 300)})


def test_concurrent_appends_never_mix(tmp_path):
    p = str(tmp_path / "m.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(p, w, 300)) for w in range(3)]
    for q in procs:
        q.start()
    for q in procs:
        q.join(120)
        assert q.exitcode == 0
    got = fsio.read_jsonl(p)
    assert got.skipped == 0 and len(got.records) == 900
    for w in range(3):
        assert [r["i"] for r in got.records if r["writer"] == w] == list(range(300))


def _tree(path) -> dict:
    return {n: open(os.path.join(path, n)).read() for n in sorted(os.listdir(path))}


def test_replace_dir_new_and_existing(tmp_path):
    final = tmp_path / "out"
    tmp = tmp_path / ".out.tmp-1"
    tmp.mkdir()
    (tmp / "a").write_text("1")
    fsio.replace_dir(tmp, final)
    assert _tree(final) == {"a": "1"} and not tmp.exists()
    tmp.mkdir()
    (tmp / "b").write_text("2")
    fsio.replace_dir(str(tmp), str(final))
    assert _tree(final) == {"b": "2"}
    assert sorted(os.listdir(tmp_path)) == ["out"]    # the old one is gone, nothing aside
