"""trainer.data.chat: loss on exactly the tokens the target generates, for a Qwen3-like template.

The template (tests/fixtures/chat/qwen3_like.jinja, written for these tests) reproduces the
behaviours of Qwen3's template that a masking must handle: no {% generation %} markers,
reasoning dropped from turns before the last user query, an empty think block on the last
assistant turn, tool calls as <tool_call> JSON, tool results as user turns.
"""

from __future__ import annotations

import pytest

from dfo_contract.exitcodes import DataError
from tests.fixtures.chat.tokenizer import byte_level_tokenizer, qwen3_like_tokenizer
from trainer.data.chat import ChatMasker, Unmaskable
from trainer.data.records import Conversation, conversation_from_record
from trainer.data.tokenizer import tokenize_chat


@pytest.fixture(scope="module", params=["char", "byte-level-bpe"])
def tok(request):
    return qwen3_like_tokenizer() if request.param == "char" else byte_level_tokenizer()


@pytest.fixture(scope="module")
def masker(tok):
    return ChatMasker(tok)


ET = "<think>\n\n</think>\n\n"  # the empty think block the template renders on the last turn


def runs(tok, ids, mask) -> list[str]:
    """The decoded text of each maximal run of loss tokens."""
    out, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    if cur:
        out.append(tok.decode(cur))
    return out


def test_template_has_no_generation_markers(tok, masker):
    assert "{% generation" not in tok.chat_template and "generation %}" not in tok.chat_template
    assert "add_generation_prompt" in tok.chat_template  # as in Qwen3's template
    assert masker.header == "<|im_start|>assistant\n"
    assert masker.prompt_tail == ""  # thinking on: the generation prompt is the header alone
    assert ChatMasker(tok, template_kwargs={"enable_thinking": False}).prompt_tail == ET
    assert masker.end_of_turn == "<|im_end|>"


def test_single_turn_empty_think_block_is_loss_unless_no_thinking(tok):
    msgs = [{"role": "user", "content": "add one: 3"}, {"role": "assistant", "content": "4, then 5."}]
    ids, mask = tokenize_chat(tok, msgs)
    text = tok.decode(ids)
    assert ET + "4, then 5." in text  # the template did insert the block
    assert runs(tok, ids, mask) == [ET + "4, then 5.<|im_end|>"]
    off = ChatMasker(tok, template_kwargs={"enable_thinking": False})
    ids, mask = off.mask(Conversation(msgs))
    assert runs(tok, ids, mask) == ["4, then 5.<|im_end|>"]


def test_multi_turn_every_assistant_turn_and_reasoning(tok):
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello there", "reasoning_content": "greet back"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "two plus two"}]
    ids, mask = tokenize_chat(tok, msgs)
    text = tok.decode(ids)
    assert "greet back" not in text  # reasoning of an earlier turn is dropped by the template
    assert runs(tok, ids, mask) == ["hello there<|im_end|>",
                                    "<think>\ntwo plus two\n</think>\n\n4<|im_end|>"]


def test_inline_think_in_content(tok):
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer"}]
    ids, mask = tokenize_chat(tok, msgs)
    assert runs(tok, ids, mask) == ["<think>\nhmm\n</think>\n\nanswer<|im_end|>"]


def test_tool_calls_under_loss_tool_results_not(tok):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "Oslo weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "weather",
                                                               "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "content": "sunny, 20C"},
            {"role": "assistant", "content": "Sunny and 20C."}]
    ids, mask = ChatMasker(tok).mask(Conversation(msgs, tools))
    got = runs(tok, ids, mask)
    assert got == ['<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
                   ET + "Sunny and 20C.<|im_end|>"]
    off = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "sunny, 20C" in off and "weather" in off  # the tool schema is prompt


def test_assistant_text_inside_a_user_message_is_not_masked(tok):
    msgs = [{"role": "user", "content": "say ok"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "ok again"}, {"role": "assistant", "content": "ok"}]
    ids, mask = tokenize_chat(tok, msgs)
    assert runs(tok, ids, mask) == ["ok<|im_end|>", ET + "ok<|im_end|>"]


def test_user_text_the_template_transforms_does_not_skip_a_turn(tok):
    t = qwen3_like_tokenizer()
    t.chat_template = t.chat_template.replace("{{ m.content }}", "{{ m.content | upper }}", 1)
    assert "{{ m.content | upper }}" in t.chat_template
    msgs = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"}, {"role": "assistant", "content": "fine"}]
    ids, mask = tokenize_chat(t, msgs)
    assert runs(t, ids, mask) == ["ok<|im_end|>", ET + "fine<|im_end|>"]


def test_sharegpt_equals_openai(masker):
    sg = conversation_from_record({"conversations": [
        {"from": "system", "value": "s"}, {"from": "human", "value": "u1"},
        {"from": "gpt", "value": "a1"}, {"from": "human", "value": "u2"}, {"from": "gpt", "value": "a2"}]})
    oa = conversation_from_record({"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"}]})
    assert masker.mask(sg) == masker.mask(oa)


def test_template_that_rewrites_content_is_unmaskable():
    t = qwen3_like_tokenizer()
    t.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | replace('secret', '***') }}"
                       "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                       "{% endif %}")
    m = ChatMasker(t)
    with pytest.raises(Unmaskable, match="does not render its content verbatim"):
        m.mask(Conversation([{"role": "user", "content": "x"}, {"role": "assistant", "content": "a secret"}]))
    with pytest.raises(DataError, match=r"^data: cannot mask the conversation: message 1"):
        tokenize_chat(t, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a secret"}])
    t.chat_template = t.chat_template.replace("replace('secret', '***')", "upper")
    with pytest.raises(Unmaskable, match="does not render assistant content verbatim"):
        ChatMasker(t)


def test_template_without_generation_prompt_or_end_token():
    t = qwen3_like_tokenizer()
    t.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(Unmaskable, match="no assistant header"):
        ChatMasker(t)


def test_no_assistant_message(masker):
    with pytest.raises(Unmaskable, match="no assistant message"):
        masker.mask(Conversation([{"role": "user", "content": "x"}]))
