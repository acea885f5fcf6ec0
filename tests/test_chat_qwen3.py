"""Chat data against Qwen3's real chat templates and tokenizer (shared fixtures, see
tests/helpers/qwen3.py): exact loss masks for every template and thinking mode, the
``tokenize`` and ``regenerate`` commands end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import qwen3
from tests.helpers.trainer import REPO
from trainer.data.chat import ChatMasker, Unmaskable
from trainer.data.records import conversation_from_record
from trainer.data.regenerate import generation_prompt

E = "<|im_end|>"
ET = "<think>\n\n</think>\n\n"  # the empty think block
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
REPLY10 = "It is <|im_start|>assistant\n followed by the reply."


def _expect(last: str, r4: str, r5: str) -> list[list[str]]:
    """The loss text of the 13 records: ``last`` opens a last turn without reasoning, ``r4``
    and ``r5`` are the last turns of the records with reasoning."""
    return [[last + "2+2 is 4." + E], [last + "Paris." + E],
            ["Hello! How can I help?" + E, last + "Why did the chicken cross the road?" + E],
            ["Yes, 7 is prime." + E, r4 + E], [r5 + E],
            [CALL + E, last + "Sunny and 21 C in Oslo." + E],
            ["Blue." + E, "Green." + E, last + "Red." + E], [last + "Bonjour" + E],
            ["\n\nok" + E, last + "ok" + E], [last + REPLY10 + E],
            ["Let me look that up.\n" + CALL + E, last + "It is 3 C." + E],
            [last + "Blue." + E], [last + "3." + E]]


R4 = "<think>\n9 is divisible by 3.\n</think>\n\nNo: 9 = 3 x 3."
R5 = "<think>\nc-a-t reversed is t-a-c.\n</think>\n\ntac"
HYBRID = _expect(ET, R4, R5)                  # SpecForge qwen3-thinking: the block is loss
HYBRID_OFF = _expect("", R4, R5)              # SpecForge qwen3-instruct: the block is prompt
THINKING = _expect("\n" + ET[len("<think>\n"):], R4[len("<think>\n"):], R5[len("<think>\n"):])
INSTRUCT = _expect("", "No: 9 = 3 x 3.", "tac")
EXPECTED = {("hybrid", "on"): HYBRID, ("hybrid", "off"): HYBRID_OFF,
            ("hybrid-revised", "on"): HYBRID, ("hybrid-revised", "off"): HYBRID_OFF,
            ("thinking-2507", "on"): THINKING, ("thinking-2507", "off"): THINKING,
            ("instruct-2507", "on"): INSTRUCT, ("instruct-2507", "off"): INSTRUCT}


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    qwen3.require_fixtures()
    return tmp_path_factory.mktemp("qwen3-tokenizers")


_TOKS: dict = {}


def tok(tokdir, name):
    if name not in _TOKS:
        _TOKS[name] = qwen3.load_tokenizer(tokdir / name, name)
    return _TOKS[name]


def masker(tokdir, name, thinking="on"):
    kw = {"enable_thinking": False} if thinking == "off" else {}
    return ChatMasker(tok(tokdir, name), template_kwargs=kw)


def runs(t, ids, mask) -> list[str]:
    out, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            out.append(t.decode(cur))
            cur = []
    return out + ([t.decode(cur)] if cur else [])


@pytest.mark.parametrize("name,thinking", sorted(EXPECTED))
def test_every_template_and_mode_masks_all_13_exactly(tokdir, name, thinking):
    m = masker(tokdir, name, thinking)
    assert m.header == "<|im_start|>assistant\n" and m.end_of_turn == E
    got = [runs(m.tok, *m.mask(conversation_from_record(r))) for r in qwen3.records()]
    for k, (g, want) in enumerate(zip(got, EXPECTED[name, thinking], strict=True), start=1):
        assert g == want, f"record {k}"


def test_hybrid_default_loss_has_no_prompt_text(tokdir):
    m = masker(tokdir, "hybrid")
    for k, rec in enumerate(qwen3.records(), start=1):
        conv = conversation_from_record(rec)
        ids, mask = m.mask(conv)
        loss = "".join(runs(m.tok, ids, mask))
        prompt = m.tok.decode([i for i, b in zip(ids, mask, strict=True) if not b])
        for msg in conv.messages:
            if msg["role"] != "assistant":
                assert msg["content"].strip() not in loss, (k, msg)
                assert msg["content"].strip() in prompt, (k, msg)  # rendered: no turn dropped
        for header in ("<|im_start|>user", "<|im_start|>system", "<|im_start|>assistant"):
            assert loss.count(header) == (k == 10 and header.endswith("assistant"))
        assert sum(t == 151645 for t, b in zip(ids, mask, strict=True) if b) == len(EXPECTED["hybrid", "on"][k - 1])


@pytest.mark.parametrize("name,opens", [("hybrid", "<think>\n"), ("thinking-2507", "")])
def test_multi_step_tool_turns_keep_their_reasoning(tokdir, name, opens):
    """After the last user query every assistant turn renders its reasoning: all under loss
    (Thinking-2507's ``<think>\\n`` is the generation prompt's, so prompt)."""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    rec = {"messages": [{"role": "user", "content": "Oslo?"},
                        {"role": "assistant", "content": None, "reasoning_content": "need the tool",
                         "tool_calls": [call]},
                        {"role": "tool", "content": "sunny"},
                        {"role": "assistant", "content": "Sunny.", "reasoning_content": "it said sunny"}],
           "tools": qwen3.TOOLS}
    m = masker(tokdir, name)
    assert runs(m.tok, *m.mask(conversation_from_record(rec))) == [
        opens + "need the tool\n</think>\n\n" + CALL + E, opens + "it said sunny\n</think>\n\nSunny." + E]


def test_reply_starting_with_a_newline_keeps_it_under_loss(tokdir):
    """Qwen's byte-level BPE merges the header's newline and the reply's into one token (ĊĊ,
    271): that token is under loss, as the token the target generates first."""
    m = masker(tokdir, "hybrid")
    ids, mask = m.mask(conversation_from_record(qwen3.records()[8]))
    first = mask.index(1)
    assert ids[first - 2:first + 1] == [151644, 77091, 271]  # <|im_start|> assistant ĊĊ
    assert m.tok.decode(ids[first:first + 2]) == "\n\nok"


def test_no_thinking_block_is_prompt_and_history_has_none(tokdir):
    on, off = masker(tokdir, "hybrid"), masker(tokdir, "hybrid", "off")
    assert on.prompt_tail == "" and off.prompt_tail == ET
    assert masker(tokdir, "thinking-2507").prompt_tail == "<think>\n"
    conv = conversation_from_record(qwen3.records()[2])
    text, spans = off.render(conv)
    assert text.count(ET) == 1  # the template puts it on the last turn only, not on history
    assert len(spans) == 2


def test_template_that_rejects_the_probe_is_unmaskable(tokdir):
    t = tok(tokdir, "hybrid")
    saved = t.chat_template
    try:
        t.chat_template = FIRST_SYSTEM + saved
        with pytest.raises(Unmaskable, match=r"fails on a probe conversation: TemplateError: "
                                             r"the first message must be a system message$"):
            ChatMasker(t)
    finally:
        t.chat_template = saved


def test_generation_prompt_follows_thinking(tokdir):
    t = tok(tokdir, "hybrid")
    msgs = [{"role": "user", "content": "hi"}]
    assert generation_prompt(t, msgs, None, {"enable_thinking": False}).endswith("assistant\n" + ET)
    assert generation_prompt(t, msgs, None, {"enable_thinking": True}).endswith("<|im_start|>assistant\n")


# --------------------------------------------------------------------------- commands

FIRST_SYSTEM = ("{%- if messages[0].role != 'system' %}{{ raise_exception('the first message must "
                "be a system message') }}{%- endif %}")


def tokenize(target, inputs, out, *extra, timeout=180):
    return subprocess.run([sys.executable, "-m", "trainer.data", "tokenize", "--target", target,
                           "--in", *inputs, "--out", out, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    qwen3.require_fixtures()
    root = tmp_path_factory.mktemp("qwen3-targets")
    return {n: qwen3.make_target(root / n, n) for n in ("hybrid", "thinking-2507")}


@pytest.mark.parametrize("name,extra", [("hybrid", ["--no-thinking", "--workers", "2"]),
                                        ("thinking-2507", ["--workers", "1"])])
def test_tokenize_keeps_all_13(tmp_path, targets, name, extra):
    data = qwen3.write_jsonl(tmp_path / "chat.jsonl", qwen3.records())
    r = tokenize(targets[name], [data], str(tmp_path / "store"), *extra)
    assert r.returncode == 0, r.stderr
    assert "samples: 13 kept of 13 records" in r.stdout and "dropped" not in r.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_template_failing_on_the_probe_is_one_line_exit_3(tmp_path, targets, workers):
    target = tmp_path / "bad"
    qwen3.make_target(target, "hybrid")
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["chat_template"] = FIRST_SYSTEM + cfg["chat_template"]
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    data = qwen3.write_jsonl(tmp_path / "chat.jsonl", qwen3.records()[:9])
    r = tokenize(str(target), [data], str(tmp_path / "store"), "--workers", workers, timeout=120)
    assert r.returncode == 3, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("trainer.data:")]
    assert errors == [r.stderr.strip().splitlines()[-1]] and "Traceback" not in r.stderr
    assert "fails on a probe conversation: TemplateError: the first message must be a system " \
           "message" in errors[0] and not os.path.exists(tmp_path / "store")


def test_a_worker_that_dies_is_one_line_exit_5(tmp_path, targets):
    """The run is killed in a worker as soon as it reports progress (never a hang)."""
    data = qwen3.write_jsonl(tmp_path / "big.jsonl", qwen3.records() * 6000)
    p = subprocess.Popen([sys.executable, "-m", "trainer.data", "tokenize", "--target", targets["hybrid"],
                          "--in", data, "--out", str(tmp_path / "store"), "--workers", "2"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        first = p.stderr.readline()
        assert first.startswith("tokenize: "), first + p.stderr.read()
        children = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        assert children, "no worker process"
        os.kill(int(children[0]), 9)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 5, err
    assert err.strip().splitlines()[-1] == ("trainer.data: tokenize: a worker process died (killed, or "
                                            "out of memory?); rerun, with fewer --workers if memory is short")
    assert "Traceback" not in err and not os.path.exists(tmp_path / "store")


def test_bad_records_are_skipped_and_counted(tmp_path, targets):
    good = qwen3.records()
    bad_json = '{"messages": [{"role": "user", "content": "tab\x01here"}]}'
    rows = [good[0], bad_json, {"conversations": [{"from": "narrator", "value": "x"},
                                                   {"from": "gpt", "value": "y"}]},
            {"messages": [{"role": "critic", "content": "x"}, {"role": "assistant", "content": "y"}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
                          {"role": "assistant", "content": "y"}]},
            good[11], good[12], {"messages": [{"role": "user", "content": "only a question"}]}]
    data = qwen3.write_jsonl(tmp_path / "mixed.jsonl", rows)
    r = tokenize(targets["hybrid"], [data], str(tmp_path / "store"), "--workers", "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "samples: 3 kept of 8 records" in out
    assert (f"dropped 1: malformed JSON (first: {data}:2: malformed JSON (Invalid control character "
            "at: line 1 column 47 (char 46)); fix or remove the line)") in out
    assert f"dropped 1: bad record: unknown ShareGPT from 'narrator' (first: {data}:3: " \
           "conversations[0].from = 'narrator'" in out
    assert f"dropped 1: bad record: unknown role 'critic' (first: {data}:4: messages[0].role" in out
    assert f"dropped 1: bad record: content part of type 'image_url' (first: {data}:5: " in out
    assert f"dropped 1: cannot mask: no assistant message (first: {data}:8)" in out
    m = json.load(open(tmp_path / "store" / "manifest.json"))
    assert m["records"] == 8 and sum(m["dropped"].values()) == 5


def test_sharegpt_function_call_renders_tool_call_tags(tokdir):
    rec = {"conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": 21}'},
        {"from": "gpt", "value": "21 C."}], "tools": json.dumps(qwen3.TOOLS)}
    m = masker(tokdir, "hybrid")
    ids, mask = m.mask(conversation_from_record(rec))
    assert runs(m.tok, ids, mask) == [CALL + E, ET + "21 C." + E]
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in m.tok.decode(ids)


# --------------------------------------------------------------------------- regenerate

@pytest.fixture(scope="module")
def gen_target(tmp_path_factory):
    qwen3.require_fixtures()
    return qwen3.make_target(tmp_path_factory.mktemp("qwen3-gen") / "t", "hybrid", weights=True)


def regenerate(target, src, out, thinking):
    return subprocess.run([sys.executable, "-m", "trainer.data", "regenerate", "--target", target,
                           "--in", src, "--out", out, "--thinking", thinking, "--batch-size", "4",
                           "--max-new-tokens", "3", "--device", "cpu"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_regenerate_records_thinking_and_tokenize_checks_it(tmp_path, gen_target):
    src = qwen3.write_jsonl(tmp_path / "in.jsonl", qwen3.records()[:4] + ["{not json"])
    out = str(tmp_path / "regen.jsonl")
    r = regenerate(gen_target, src, out, "off")
    assert r.returncode == 0, r.stderr
    assert f"regenerated 4 samples into {out} (0 already done) with transformers; thinking off" in r.stdout
    assert f"skipped 1: malformed JSON (first: {src}:5: malformed JSON (Expecting property name" in r.stdout
    meta = json.load(open(out + ".meta.json"))
    assert meta["thinking"] == "off" and meta["format"] == "dfo-regenerated" and meta["version"] == 1
    assert len(open(out).readlines()) == 4
    # resuming in the other mode would mix the two
    r = regenerate(gen_target, src, out, "on")
    assert r.returncode == 3 and r.stderr.strip() == (
        f"trainer.data: --thinking on: {out} was generated with --thinking off; use that, or a new --out")
    # tokenize warns in one line when its mode disagrees with the data's
    w = tokenize(gen_target, [out], str(tmp_path / "s1"), "--workers", "1")
    assert w.returncode == 0, w.stderr
    warn = [line for line in w.stderr.splitlines() if "warning" in line]
    assert warn == [f"tokenize: warning: {out} was generated with --thinking off; pass --no-thinking "
                    "so the empty think block is prompt, as when it was generated"]
    w = tokenize(gen_target, [out], str(tmp_path / "s2"), "--workers", "1", "--no-thinking")
    assert w.returncode == 0 and "warning" not in w.stderr


#: the DeepSeek-R1 family's shape (with Qwen3's tokens, so Qwen3's tokenizer reads it): an
#: assistant turn renders its content with everything up to `</think>` cut off, and never
#: reads reasoning_content; the generation prompt opens a think block
R1_SHAPE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")

R1_RECORDS = [
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "Is 9 prime?"},
                  {"role": "assistant", "content": "<think>\n9 = 3 x 3.\n</think>\n\nNo."},
                  {"role": "user", "content": "And 7?"},
                  {"role": "assistant", "content": "<think>\nonly 1 and 7.\n</think>\n\nYes."}]},
]


def test_a_template_that_strips_inline_think_masks_the_reply_it_renders(tokdir, tmp_path):
    from transformers import AutoTokenizer

    d = qwen3.write_tokenizer(tmp_path / "r1", R1_SHAPE)
    t = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    m = ChatMasker(t)
    assert m.prompt_tail == "<think>\n"
    got = [runs(t, *m.mask(conversation_from_record(r))) for r in R1_RECORDS]
    # the reply as rendered: the "\n\n" after </think> included, and the token that
    # holds it together with the header's newline (module doc of trainer.data.chat)
    assert got == [["4" + E], ["\n\n\nNo." + E, "\n\n\nYes." + E]]
    assert not any("9 = 3 x 3" in x or "only 1" in x for x in got[1])


def test_tokenize_keeps_records_whose_template_strips_inline_think(tmp_path, targets):
    target = tmp_path / "r1"
    qwen3.make_target(target, "hybrid")
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["chat_template"] = R1_SHAPE
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    data = qwen3.write_jsonl(tmp_path / "chat.jsonl", R1_RECORDS)
    r = tokenize(str(target), [data], str(tmp_path / "store"), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "samples: 2 kept of 2 records" in r.stdout and "dropped" not in r.stdout, r.stdout
