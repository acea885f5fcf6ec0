"""The offset line reader shared by the supervisor and ``follow``."""

from __future__ import annotations

from orchestrator.supervisor.lines import CompleteLine, read_lines


def test_only_complete_lines_until_final(tmp_path):
    p = tmp_path / "a.log"
    assert read_lines(p, 0) == ([], 0)                       # not there yet
    p.write_bytes(b"one\n\ntw")
    lines, off = read_lines(p, 0)
    assert lines == [CompleteLine("one", 4), CompleteLine("", 5)] and off == 5
    with open(p, "ab") as f:
        f.write(b"o\nthr")
    lines, off = read_lines(p, off)
    assert lines == [CompleteLine("two", 9)] and off == 9
    assert read_lines(p, off) == ([], 9)
    lines, off = read_lines(p, off, final=True)              # the writer is gone
    assert lines == [CompleteLine("thr", 12)] and off == 12


def test_a_utf8_character_split_across_writes_is_never_cut(tmp_path):
    p = tmp_path / "u.log"
    data = "ünïcödé\n".encode()
    p.write_bytes(data[:2])                                   # half of "ü" and more
    assert read_lines(p, 0) == ([], 0)
    p.write_bytes(data)
    lines, off = read_lines(p, 0)
    assert lines == [CompleteLine("ünïcödé", len(data))] and off == len(data)


def test_offsets_resume_exactly(tmp_path):
    p = tmp_path / "r.log"
    p.write_bytes(b"a\nbb\nccc\n")
    lines, _ = read_lines(p, 0)
    again, off = read_lines(p, lines[0].end)
    assert [ln.text for ln in again] == ["bb", "ccc"] and off == 9
