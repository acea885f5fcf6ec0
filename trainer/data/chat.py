"""Chat conversations -> token ids + a loss mask over exactly what the target generates.

Works for any chat template, with or without ``{% generation %}`` markers: the conversation
is rendered ONCE with the tokenizer's template (text), each assistant turn is located in the
text, and the character span is mapped to tokens with the fast tokenizer's offsets.

Per assistant turn the loss span runs from the end of the assistant header to the end-of-turn
token, inclusive:

- the header ``H`` is what ``add_generation_prompt`` appends (``<|im_start|>assistant\\n``);
- an empty think block ``T`` right after it is skipped: ``T`` is what the template adds to the
  generation prompt when ``enable_thinking=False`` (``<think>\\n\\n</think>\\n\\n`` for Qwen3),
  because at serving time it is part of the prompt, never generated;
- reasoning the template renders (``reasoning_content``, Qwen3: the turns after the last user
  query) is generated, so it is under loss with its tags; reasoning the template drops
  (earlier turns) is not in the text and is not trained on;
- tool calls rendered between the content and the end of turn are under loss;
- the end-of-turn token ``E`` is the first token the template puts after an assistant's
  content (``<|im_end|>``), found by rendering a probe conversation.

A turn that cannot be located raises ``Unmaskable`` with the reason; callers drop the sample
and report it with file:line.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool",
                  "function_response": "tool", "function_call": "assistant"}
_PROBE_USER = "Xu"
_PROBE_REPLY = "Zq7"


class Unmaskable(Exception):
    """A conversation whose assistant tokens cannot be located (the message is the reason)."""


class BadRecord(Exception):
    """A record that is not a conversation this reader understands (the message says why)."""


@dataclass(frozen=True)
class Conversation:
    messages: list[dict]
    tools: list | None = None


def conversation_from_record(obj: dict) -> Conversation:
    """OpenAI ``messages`` or ShareGPT ``conversations`` (from/value) -> a Conversation."""
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRecord("tools must be a list of tool schemas")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(_is_message(m) for m in msgs):
            raise BadRecord("messages must be a non-empty list of {\"role\": str, \"content\": str} "
                            "objects (content may be null when tool_calls is given)")
        return Conversation([dict(m) for m in msgs], tools)
    if "conversations" in obj:
        conv = obj["conversations"]
        if not isinstance(conv, list) or not conv:
            raise BadRecord("conversations must be a non-empty list of {\"from\": ..., \"value\": ...}")
        out = []
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise BadRecord(f"conversations[{j}] must be {{\"from\": str, \"value\": str}}")
            role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise BadRecord(f"conversations[{j}].from = {turn.get('from')!r}; expected "
                                "human, gpt, system or tool")
            out.append({"role": role, "content": turn["value"]})
        return Conversation(out, tools)
    raise BadRecord("missing field 'messages' (chat lines need messages or conversations; "
                    "tokenized lines need input_ids and loss_mask)")


def _is_message(m) -> bool:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return False
    c = m.get("content")
    return isinstance(c, str) or (c is None and bool(m.get("tool_calls")))


class ChatMasker:
    """Renders conversations with one tokenizer's template and masks the generated tokens."""

    def __init__(self, tokenizer, *, template_kwargs: dict | None = None):
        if not getattr(tokenizer, "is_fast", False):
            raise Unmaskable("the target's tokenizer is not a fast tokenizer (no offset mapping); "
                             "pre-tokenize the data with input_ids/loss_mask")
        if not getattr(tokenizer, "chat_template", None):
            raise Unmaskable("the target's tokenizer has no chat template; pre-tokenize the data "
                             "with input_ids/loss_mask")
        self.tok = tokenizer
        self.kw = dict(template_kwargs or {})
        self.thinks = "reasoning_content" in str(tokenizer.chat_template)
        probe = [{"role": "user", "content": _PROBE_USER}]
        base = self._render(probe)
        gen = self._render(probe, add_generation_prompt=True)
        if not gen.startswith(base) or len(gen) == len(base):
            raise Unmaskable("the chat template adds no assistant header with add_generation_prompt")
        self.header = gen[len(base):]
        try:
            off = self._render(probe, add_generation_prompt=True, enable_thinking=False)
        except Exception:  # noqa: BLE001 - a template that rejects the flag simply has no think block
            off = gen
        self.empty_think = off[len(gen):] if off.startswith(gen) else ""
        full = self._render(probe + [{"role": "assistant", "content": _PROBE_REPLY}])
        at = full.rfind(_PROBE_REPLY)
        enc = self._encode(full)
        after = [(a, b) for a, b in enc["offset_mapping"] if a >= at + len(_PROBE_REPLY) and b > a]
        if at < 0:
            raise Unmaskable("the chat template does not render assistant content verbatim")
        if not after:
            raise Unmaskable("the chat template puts no end-of-turn token after an assistant message")
        self.end_of_turn = full[after[0][0]:after[0][1]]

    # -- rendering --------------------------------------------------------------------------
    def _render(self, messages, tools=None, **kw) -> str:
        args = dict(self.kw)
        args.update(kw)
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False, **args)

    def _encode(self, text: str):
        return self.tok(text, add_special_tokens=False, return_offsets_mapping=True)

    def _split_inline_think(self, m: dict) -> dict:
        """``<think>R</think>C`` in content -> reasoning_content R, content C (templates that
        render reasoning_content do this split themselves; doing it first lets us locate C)."""
        c = m.get("content")
        if (not self.thinks or m.get("role") != "assistant" or m.get("reasoning_content") is not None
                or not isinstance(c, str) or "</think>" not in c):
            return m
        head, _, tail = c.partition("</think>")
        m = dict(m)
        m["reasoning_content"] = head.split("<think>")[-1].strip("\n")
        m["content"] = tail.lstrip("\n")
        return m

    # -- masking ----------------------------------------------------------------------------
    def render(self, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character span under loss for each assistant turn."""
        msgs = [self._split_inline_think(m) for m in conv.messages]
        if not any(m["role"] == "assistant" for m in msgs):
            raise Unmaskable("no assistant message")
        text = self._render(msgs, conv.tools)
        spans: list[tuple[int, int]] = []
        cur = 0
        for k, m in enumerate(msgs):
            content = (m.get("content") or "").strip()
            if m["role"] != "assistant":
                j = text.find(content, cur) if content else -1
                nxt = text.find(self.header, cur)
                if j >= 0 and (nxt < 0 or j < nxt):  # a transformed message never skips a header
                    cur = j + len(content)
                continue
            h = text.find(self.header, cur)
            if h < 0:
                raise Unmaskable(f"message {k} (assistant): its header {self.header!r} is not in "
                                 "the rendered conversation")
            start = h + len(self.header)
            if self.empty_think and text.startswith(self.empty_think, start):
                start += len(self.empty_think)
            end_piece = start
            if content:
                j = text.find(content, start)
                if j < 0:
                    raise Unmaskable(f"message {k} (assistant): the template does not render its "
                                     "content verbatim")
                end_piece = j + len(content)
            elif not m.get("tool_calls"):
                raise Unmaskable(f"message {k} (assistant) is empty")
            e = text.find(self.end_of_turn, end_piece)
            nxt = text.find(self.header, start)
            if e < 0 or (0 <= nxt < e):
                raise Unmaskable(f"message {k} (assistant): no end-of-turn {self.end_of_turn!r} "
                                 "after its content")
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call) if isinstance(call, dict) else {}
                name = fn.get("name") if isinstance(fn, dict) else None
                if not isinstance(name, str) or text.find(name, start, e) < 0:
                    raise Unmaskable(f"message {k} (assistant): tool call {name!r} is not rendered "
                                     "in its turn")
            spans.append((start, e + len(self.end_of_turn)))
            cur = e + len(self.end_of_turn)
        return text, spans

    def mask(self, conv: Conversation) -> tuple[list[int], list[int]]:
        """Token ids of the rendered conversation and its 0/1 loss mask."""
        text, spans = self.render(conv)
        enc = self._encode(text)
        ids = list(enc["input_ids"])
        mask = [0] * len(ids)
        si = 0
        for t, (a, _b) in enumerate(enc["offset_mapping"]):
            while si < len(spans) and a >= spans[si][1]:
                si += 1
            if si == len(spans):
                break
            s, e = spans[si]
            if s <= a < e:  # by start: robust to trimmed offsets; a token straddling s is prompt
                mask[t] = 1
        if not any(mask):
            raise Unmaskable("no assistant token survived tokenization")
        return ids, mask


def regenerated_message(masker: ChatMasker, text: str) -> dict:
    """An assistant message from generated text (split ``<think>...</think>`` into reasoning)."""
    m = {"role": "assistant", "content": text}
    return masker._split_inline_think(m) if "</think>" in text else m
