"""Pure logic of chat data: record normalization (trainer.data.records), the token/span loss
mask (trainer.data.chat.span_mask), skip counting and the regenerate thinking metadata."""

from __future__ import annotations

import json

import pytest

from dfo_contract.exitcodes import DataError
from trainer.data.chat import Unmaskable, span_mask
from trainer.data.formats import BadLine, Skippable, iter_records, record_sample
from trainer.data.meta import RegenMeta, read_meta, thinking_warnings, write_meta
from trainer.data.records import BadRecord, conversation_from_record
from trainer.data.tokenized import Summary


def msgs(rec):
    return conversation_from_record(rec).messages


def test_developer_is_system_function_is_tool():
    got = msgs({"messages": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"},
                             {"role": "function", "content": "42", "name": "f"}]})
    assert [m["role"] for m in got] == ["system", "user", "tool"] and got[2]["name"] == "f"


@pytest.mark.parametrize("role", ["critic", "ipython", "Assistant"])
def test_unknown_role_is_a_bad_record_not_a_dropped_turn(role):
    with pytest.raises(BadRecord, match=rf"messages\[1\]\.role = '{role}'; expected system, user") as e:
        msgs({"messages": [{"role": "user", "content": "q"}, {"role": role, "content": "x"}]})
    assert e.value.reason == f"unknown role {role!r}"


def test_text_content_parts_are_joined():
    got = msgs({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b",
                                                          {"text": "c"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "d"}]}]})
    assert [m["content"] for m in got] == ["a\nb\nc", "d"]
    with pytest.raises(BadRecord, match=r"content\[0\] is of type 'image_url'; only text parts"):
        msgs({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})


def test_null_content_is_empty_on_assistant_only():
    call = {"function": {"name": "f", "arguments": '{"x": 1}'}}
    got = msgs({"messages": [{"role": "user", "content": "q"},
                             {"role": "assistant", "content": None, "tool_calls": [call]}]})
    assert got[1]["content"] == "" and got[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    with pytest.raises(BadRecord, match=r"messages\[0\]\.content is null") as e:
        msgs({"messages": [{"role": "user", "content": None}]})
    assert e.value.reason == "user content is null"
    with pytest.raises(BadRecord, match="tool_calls\\[0\\] must be"):
        msgs({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]})


def test_sharegpt_function_call_becomes_tool_calls():
    fc = {"from": "function_call", "value": '{"name": "w", "arguments": {"c": "Oslo"}}'}
    call = {"type": "function", "function": {"name": "w", "arguments": {"c": "Oslo"}}}
    got = msgs({"conversations": [{"from": "human", "value": "q"}, fc,
                                  {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "ok"}]})
    assert got == [{"role": "user", "content": "q"},
                   {"role": "assistant", "content": "", "tool_calls": [call]},
                   {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "ok"}]
    merged = msgs({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "Let me see."},
                                     fc, fc]})
    assert merged[1] == {"role": "assistant", "content": "Let me see.", "tool_calls": [call, call]}
    with pytest.raises(BadRecord, match=r"conversations\[1\]\.value: a function_call must be JSON"):
        msgs({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "w()"}]})


def test_sharegpt_unknown_from_and_string_tools():
    with pytest.raises(BadRecord, match=r"conversations\[0\]\.from = 'narrator'; expected human") as e:
        msgs({"conversations": [{"from": "narrator", "value": "x"}]})
    assert e.value.reason == "unknown ShareGPT from 'narrator'"
    conv = conversation_from_record({"conversations": [{"from": "human", "value": "q"}],
                                     "tools": json.dumps([{"name": "w"}])})
    assert conv.tools == [{"name": "w"}]


def test_span_mask_takes_the_token_holding_a_spans_first_char():
    # "<s>assistant\n" | "\nok<e>": token (12, 14) holds the header's and the reply's newline
    offsets = [(0, 3), (3, 12), (12, 14), (14, 16), (16, 19), (19, 20)]
    assert span_mask(offsets, [(13, 19)], 6) == [0, 0, 1, 1, 1, 0]
    assert span_mask(offsets, [(14, 19)], 6) == [0, 0, 0, 1, 1, 0]  # a clean boundary
    assert span_mask(offsets, [(3, 12), (16, 19)], 6) == [0, 1, 0, 0, 1, 0]
    with pytest.raises(Unmaskable, match="no assistant token"):
        span_mask(offsets, [(20, 20)], 6)


def test_bad_lines_skip_or_raise_with_the_full_json_message(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{"b": "x\x02y"}\n')
    got = list(iter_records(str(p), skip_bad=True))
    assert got[0] == (1, {"a": 1}) and isinstance(got[1][1], BadLine)
    with pytest.raises(Skippable) as e:
        record_sample(got[1][1], "data: d:2", fmt="auto", masker=None, vocab_size=10)
    assert e.value.reason == "malformed JSON" and isinstance(e.value, DataError)
    assert str(e.value).endswith("(Invalid control character at: line 1 column 9 (char 8)); fix or "
                                 "remove the line")
    with pytest.raises(Skippable, match="Invalid control character at: line 1 column 9"):
        list(iter_records(str(p)))


def test_summary_keeps_the_first_full_message_per_reason():
    s = Summary()
    s.drop("malformed JSON", "f:2", "f:2: malformed JSON (Expecting value: line 1 column 1 (char 0))")
    s.drop("malformed JSON", "f:5", "f:5: other")
    s.drop("cannot mask: no assistant message", "f:7")
    s.records, s.kept = 10, 7
    assert s.lines()[1:3] == [
        "dropped 2: malformed JSON (first: f:2: malformed JSON (Expecting value: line 1 column 1 (char 0)))",
        "dropped 1: cannot mask: no assistant message (first: f:7)"]


def test_thinking_metadata_and_the_tokenize_warning(tmp_path):
    out = str(tmp_path / "regen.jsonl")
    assert read_meta(out) is None and thinking_warnings([out], False) == []
    write_meta(out, RegenMeta(thinking="off", target="/t"))
    assert read_meta(out) == RegenMeta(thinking="off", target="/t")
    assert thinking_warnings([out], True) == []
    (w,) = thinking_warnings([out], False)
    assert w.startswith(f"tokenize: warning: {out} was generated with --thinking off; pass --no-thinking")
    write_meta(out, RegenMeta(thinking="on", target="/t"))  # no output yet: a fresh start
    assert thinking_warnings([out], True)[0].endswith("drop --no-thinking so the masks match how it "
                                                      "was generated")
    open(out, "w").write('{"index": 0}\n')
    with pytest.raises(DataError, match=r"^--thinking off: .* was generated with --thinking on; use that"):
        write_meta(out, RegenMeta(thinking="off", target="/t"))


def test_tokenize_usage_errors_are_one_line_exit_3(tmp_path, capsys):
    from trainer.data.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 128}))
    assert main(["tokenize", "--target", str(tmp_path), "--in", str(tmp_path / "nope.jsonl"),
                 "--out", str(tmp_path / "s")]) == 3
    assert capsys.readouterr().err == f"trainer.data: --in: {tmp_path}/nope.jsonl: no such file\n"
    assert main(["tokenize", "--target", str(tmp_path / "none"), "--in", "x", "--out", "y"]) == 3
    assert "config.json: unreadable" in capsys.readouterr().err
