"""Chat conversations -> token ids + a loss mask over exactly what the target generates.

Works for any chat template, with or without ``{% generation %}`` markers: the conversation
is rendered ONCE with the tokenizer's template (text), each assistant turn is located in the
text, and the character span is mapped to tokens with the fast tokenizer's offsets.

Three probe renders (a user turn; the same with the generation prompt; user, assistant,
user) give:

- the role header ``H``: how the template opens an assistant turn that precedes a later user
  turn, cut to what the generation prompt also starts with (Qwen3: ``<|im_start|>assistant\\n``);
- the prompt tail ``P``: the rest of the generation prompt. It is part of the prompt at
  serving time, never generated, so where a rendered turn starts with it, it is not under
  loss. Qwen3: ``<think>\\n`` for Thinking-2507; ``<think>\\n\\n</think>\\n\\n`` for the
  hybrid template with ``enable_thinking=False`` (``tokenize --no-thinking``); nothing for the
  hybrid template in its default mode, where the empty think block the template renders on
  the last turn stays under loss (the model writes it when it decides not to think);
- the end-of-turn ``E``: the first token after an assistant's content (``<|im_end|>``).

Per assistant turn the loss span runs from after ``H`` (and ``P`` where present) to ``E``,
inclusive: reasoning the template renders (Qwen3: turns after the last user query) with its
tags, the content, tool calls. Reasoning the template drops (earlier turns) is not in the text
and is not trained on; nor is an inline ``<think>...</think>`` that the template cuts from
``content`` without reading ``reasoning_content`` (DeepSeek-R1's): the reply after it, as
rendered, is the turn's content. A token that spans the start of a turn's span (Qwen's ``ĊĊ`` when a
reply starts with a newline right after the header's newline) is under loss: it is the
token the target generates first.

Per conversation the cost is one template render and one encode: the Rust tokenizer is
called directly (``Encoder``), and the mask is computed over the offsets with numpy.

A turn that cannot be located raises ``Unmaskable`` with the reason; callers drop the sample
and report it with file:line. A template that fails on the probes raises ``Unmaskable``
naming the template's error (the data cannot be masked at all).
"""

from __future__ import annotations

import os
import unicodedata
from typing import Any, Literal
from itertools import chain

import numpy as np

from .records import Conversation

_PROBE_USER = "Xu"
_PROBE_REPLY = "Zq7"
_PROBE_NEXT = "Yv"


class Unmaskable(Exception):
    """A conversation whose assistant tokens cannot be located (the message is the reason)."""


def template_error(e: Exception) -> str:
    """One line naming a chat template's exception."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


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
        self.encoder = Encoder(tokenizer)
        self.kw = dict(template_kwargs or {})
        self.thinks = "reasoning_content" in str(tokenizer.chat_template)
        try:
            self._probe()
        except Unmaskable:
            raise
        except Exception as e:  # noqa: BLE001 - any template failure: one line naming it
            raise Unmaskable(f"the chat template fails on a probe conversation: {template_error(e)}") from None

    def _probe(self) -> None:
        user = {"role": "user", "content": _PROBE_USER}
        base = self._render([user])
        gen = self._render([user], add_generation_prompt=True)
        if not gen.startswith(base) or len(gen) == len(base):
            raise Unmaskable("the chat template adds no assistant header with add_generation_prompt")
        hist = self._render([user, {"role": "assistant", "content": _PROBE_REPLY},
                             {"role": "user", "content": _PROBE_NEXT}])
        at = hist.find(_PROBE_REPLY, len(base)) if hist.startswith(base) else -1
        if at < 0:
            raise Unmaskable("the chat template does not render assistant content verbatim")
        header = os.path.commonprefix([hist[len(base):at], gen[len(base):]])
        if not header:
            raise Unmaskable(f"the chat template opens assistant turns with {hist[len(base):at]!r}, "
                             f"its generation prompt with {gen[len(base):]!r}")
        self.header = header
        self.prompt_tail = gen[len(base) + len(header):]
        _, offsets = self.encoder.encode(hist)
        after = [(a, b) for a, b in offsets if a >= at + len(_PROBE_REPLY) and b > a]
        if not after:
            raise Unmaskable("the chat template puts no end-of-turn token after an assistant message")
        self.end_of_turn = hist[after[0][0]:after[0][1]]

    # -- rendering --------------------------------------------------------------------------
    def _render(self, messages, tools=None, **kw) -> str:
        args = dict(self.kw)
        args.update(kw)
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False, **args)

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
            if m["role"] != "assistant":
                content = (m.get("content") or "").strip()
                j = text.find(content, cur) if content else -1
                nxt = text.find(self.header, cur)
                if j >= 0 and (nxt < 0 or j < nxt):  # a transformed message never skips a header
                    cur = j + len(content)
                continue
            start, end = self._turn(text, cur, k, m)
            spans.append((start, end))
            cur = end
        return text, spans

    def _turn(self, text: str, cur: int, k: int, m: dict) -> tuple[int, int]:
        """The loss span of assistant message ``k``, the first assistant turn at or after ``cur``."""
        h = text.find(self.header, cur)
        if h < 0:
            raise Unmaskable(f"message {k} (assistant): its header {self.header!r} is not in "
                             "the rendered conversation")
        start = h + len(self.header)
        if self.prompt_tail and text.startswith(self.prompt_tail, start):
            start += len(self.prompt_tail)
        content = (m.get("content") or "").strip()
        end_piece = start
        eot = text.find(self.end_of_turn, start)
        if content and not 0 <= text.find(content, start) < (eot if eot >= 0 else len(text)) \
                and "</think>" in content:
            # a template that drops an inline <think>...</think> (DeepSeek-R1's do, without
            # reading reasoning_content): what it renders verbatim is the reply after it
            content = content.partition("</think>")[2].strip()
            if not content and not m.get("tool_calls"):
                return start, self._end(text, start, k)
        if content:
            j = text.find(content, start)
            if j < 0 or 0 <= eot < j:
                raise Unmaskable(f"message {k} (assistant): the template does not render its "
                                 "content verbatim")
            end_piece = j + len(content)
        elif not m.get("tool_calls"):
            raise Unmaskable(f"message {k} (assistant) is empty")
        e = self._end(text, end_piece, k) - len(self.end_of_turn)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str) or text.find(name, end_piece, e) < 0:
                raise Unmaskable(f"message {k} (assistant): tool call {name!r} is not rendered "
                                 "in its turn")
        return start, e + len(self.end_of_turn)

    def _end(self, text: str, end_piece: int, k: int) -> int:
        """Where assistant message ``k``'s turn ends: after the end-of-turn that follows its
        content (which ends at ``end_piece``)."""
        e = text.find(self.end_of_turn, end_piece)
        nxt = text.find(self.header, end_piece)  # a header inside the reply is the reply's text
        if e < 0 or (0 <= nxt < e):
            raise Unmaskable(f"message {k} (assistant): no end-of-turn {self.end_of_turn!r} "
                             "after its content")
        return e + len(self.end_of_turn)

    def mask(self, conv: Conversation) -> tuple[list[int], list[int]]:
        """Token ids of the rendered conversation and its 0/1 loss mask."""
        ids, mask = self.mask_arrays(conv)
        return ids.tolist(), mask.tolist()

    def mask_arrays(self, conv: Conversation) -> tuple[np.ndarray, np.ndarray]:
        """``mask`` as arrays: ids (int64) and the 0/1 loss mask (uint8)."""
        text, spans = self.render(conv)
        ids, offsets = self.encoder.encode(text)
        return np.asarray(ids, dtype=np.int64), span_mask_array(offsets, spans)


NormalForm = Literal["NFC", "NFD", "NFKC", "NFKD"]
NORMAL_FORMS: tuple[NormalForm, ...] = ("NFC", "NFD", "NFKC", "NFKD")


class Encoder:
    """``tokenizer(text, add_special_tokens=False)`` ids and offsets, straight from the Rust
    tokenizer (no BatchEncoding). Where the tokenizer's normalizer is a Unicode normal form
    alone (Qwen3: NFC), text already in that form is encoded by a copy without it: the same
    ids and offsets, without the normalizer's per-character alignment work."""

    def __init__(self, tokenizer):
        self.full = tokenizer._tokenizer
        if self.full.truncation is not None:  # as the tokenizer's __call__ does without truncation=
            self.full.no_truncation()
        if self.full.padding is not None:
            self.full.no_padding()
        self.plain: Any = None
        self.form: NormalForm | None = None
        from tokenizers import Tokenizer, normalizers

        forms = [f for f in NORMAL_FORMS
                 if type(self.full.normalizer) is getattr(normalizers, f, None)]
        if forms:
            self.plain = Tokenizer.from_str(self.full.to_str())
            self.plain.normalizer = None
            self.form = forms[0]

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        tok = self.full
        if self.plain is not None and self.form is not None \
                and unicodedata.is_normalized(self.form, text):
            tok = self.plain
        enc = tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets


def span_mask(offsets, spans: list[tuple[int, int]], n: int) -> list[int]:
    """1 for every token that overlaps a character span (spans sorted, disjoint): a token that
    holds the first character of a span is under loss even when it starts before it."""
    return span_mask_array(offsets[:n], spans).tolist()


def span_mask_array(offsets, spans: list[tuple[int, int]]) -> np.ndarray:
    """``span_mask`` over numpy: token ``t`` (a, b) is held against the first span not ending at
    or before any token start so far (a running maximum, as a scan over sorted spans gives);
    a token past the last span is 0."""
    off = np.fromiter(chain.from_iterable(offsets), dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)
    a, b = off[:, 0], off[:, 1]
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    si = np.maximum.accumulate(np.searchsorted(sp[:, 1], a, side="right")) if len(a) else a
    live = si < len(sp)
    s = sp[np.minimum(si, len(sp) - 1), 0] if len(sp) else a
    e = sp[np.minimum(si, len(sp) - 1), 1] if len(sp) else a
    hit = np.where(b > a, (a < e) & (b > s), (s <= a) & (a < e)) & live
    if not hit.any():
        raise Unmaskable("no assistant token survived tokenization")
    return hit.astype(np.uint8)


def regenerated_message(masker: ChatMasker, text: str) -> dict:
    """An assistant message from generated text (split ``<think>...</think>`` into reasoning)."""
    m = {"role": "assistant", "content": text}
    return masker._split_inline_think(m) if "</think>" in text else m
