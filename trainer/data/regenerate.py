"""The target rewrites the assistant turns of a chat dataset (greedy, batched, resumable).

Drafters trained on the target's own outputs accept more. For every conversation, each
assistant turn in order is replaced by the target's reply to the conversation so far
(earlier turns already rewritten). Assistant turns that carry ``tool_calls`` are kept as they
are (the tool results after them answer those exact calls). The replies come from an engine
(trainer.data.engines: transformers, the reference; an OpenAI-compatible server; vLLM).

**Wavefront.** Up to ``batch_size`` conversations are open at once. Each round asks the engine
for the next pending turn of every open conversation together; turn k of a conversation is
asked only after turn k-1 is rewritten. A conversation whose turns are all rewritten is
closed and the next record of the input takes its place at the next round, so the engine
always has ``batch_size`` requests (at most ``4 * batch_size`` conversations wait, open or
closed, for an earlier one to be written).

The output is JSONL, appended to: one line per conversation
``{"index": i, "line": L, "messages": [...], "tools": [...]?}`` (``i`` counts records of the
input from 0), in index order, flushed and fsynced after each round that closed one. A rerun
reads the output, drops a torn last line, and skips every index already there: kill it at
any point and run it again.

``thinking`` ("on"/"off") is passed to the chat template as ``enable_thinking`` when the
generation prompt is rendered, and recorded in ``OUT.meta.json`` (trainer.data.meta) with the
sampling parameters and the engine; resuming an output in the other mode is a data error.
Records that cannot be read (malformed JSON, not a conversation, a template error) or whose
prompt and ``max_new_tokens`` do not fit the context (``max_model_len``, by default the
target's ``max_position_embeddings``) are skipped and counted in ``progress.summary`` with
file:line.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict, dataclass

from dfo_contract.exitcodes import DataError, TrainerConfigError

from .chat import ChatMasker, Unmaskable, regenerated_message, template_error
from .engines import (Engine, EngineSpec, Sampling, TargetInfo, TurnReply, TurnRequest, check_spec,
                      open_engine)
from .formats import BadLine, count_records, iter_records
from .meta import RegenMeta, write_meta
from .records import BadRecord, Conversation, conversation_from_record
from .progress import Progress
from .tokenizer import load_tokenizer

#: conversations open or waiting to be written, per ``batch_size``
WAITING = 4
TOO_LONG = "longer than the context"


def done_indices(out: str) -> set[int]:
    """Indices already in ``out``; a torn or unreadable tail is cut off (the file is ours)."""
    if not os.path.isfile(out):
        return set()
    done: set[int] = set()
    good = 0
    with open(out, "rb") as f:
        pos = 0
        for raw in f:
            pos += len(raw)
            if not raw.endswith(b"\n"):
                break
            try:
                done.add(int(json.loads(raw)["index"]))
            except (ValueError, KeyError, TypeError):
                break
            good = pos
    if good != os.path.getsize(out):
        with open(out, "r+b") as f:
            f.truncate(good)
            f.flush()
            os.fsync(f.fileno())
    return done


def generation_prompt(tok, messages: list[dict], tools, template_kwargs: dict) -> str:
    """The prompt the target continues: the conversation so far and the generation prompt
    (with ``enable_thinking`` off, Qwen3's hybrid template ends it with an empty think block)."""
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                   **template_kwargs)


def context_limit(target: str) -> int | None:
    """The target's ``max_position_embeddings`` (None when its config does not say)."""
    try:
        with open(os.path.join(target, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    v = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return v if isinstance(v, int) else None


@dataclass
class Open:
    """One conversation being rewritten."""
    idx: int
    line: int
    conv: Conversation
    msgs: list[dict]
    turns: list[int]                 # the assistant turns to rewrite, in order
    next: int = 0                    # how many are rewritten
    dropped: tuple[str, str] | None = None   # (reason, message)

    @property
    def closed(self) -> bool:
        return self.dropped is not None or self.next >= len(self.turns)

    def row(self) -> dict:
        rec = {"index": self.idx, "line": self.line, "messages": self.msgs}
        if self.conv.tools is not None:
            rec["tools"] = self.conv.tools
        return rec


def open_conversation(idx: int, line: int, conv: Conversation) -> Open:
    msgs = [dict(m) for m in conv.messages]
    turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant" and not m.get("tool_calls")]
    return Open(idx, line, conv, msgs, turns)


def reply_message(masker: ChatMasker, r: TurnReply) -> dict:
    """The assistant message for a reply (``<think>...</think>`` split into reasoning)."""
    if r.reasoning is None:
        m = regenerated_message(masker, r.text)
    else:
        m = {"role": "assistant", "reasoning_content": r.reasoning, "content": r.text}
    if r.tool_calls:
        m["tool_calls"] = r.tool_calls
    return m


class Rewriter:
    """The target's tokenizer and template, and one engine: runs the rounds of a wavefront."""

    def __init__(self, target: str, spec: EngineSpec, sampling: Sampling, template_kwargs: dict,
                 max_model_len: int | None):
        tok = load_tokenizer(target)
        if tok is None:
            raise DataError(f"--target: {target}: no tokenizer; regenerate needs the target's tokenizer")
        try:
            self.masker = ChatMasker(tok, template_kwargs=template_kwargs)
        except Unmaskable as e:
            raise DataError(f"--target: {target}: {e}") from None
        self.tok, self.kw, self.s = tok, dict(template_kwargs), sampling
        self.limit = max_model_len or context_limit(target)
        eot = tok.convert_tokens_to_ids(self.masker.end_of_turn)
        self.engine: Engine = open_engine(spec, TargetInfo(target, tok, eot, self.kw), sampling)

    def request(self, c: Open) -> TurnRequest | None:
        """The request for ``c``'s next turn; None (and ``c`` dropped) when it cannot be asked."""
        k = c.turns[c.next]
        try:
            text = generation_prompt(self.tok, c.msgs[:k], c.conv.tools, self.kw)
        except Exception as e:  # noqa: BLE001 - any template failure: one line naming it
            c.dropped = ("template error", template_error(e))
            return None
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if self.limit is not None and len(ids) + self.s.max_new_tokens > self.limit:
            c.dropped = (TOO_LONG, f"turn {k}: {len(ids)} prompt tokens + --max-new-tokens "
                                   f"{self.s.max_new_tokens} > the context {self.limit}")
            return None
        return TurnRequest([dict(m) for m in c.msgs[:k]], c.conv.tools, ids)

    def round(self, convs: list[Open], on_reply=None) -> None:
        """Rewrite the next turn of every conversation in ``convs`` (one engine call)."""
        asked = [(c, r) for c in convs if (r := self.request(c)) is not None]
        if not asked:
            return
        for (c, _), rep in zip(asked, self.engine.generate([r for _, r in asked], on_reply),
                                strict=True):
            c.msgs[c.turns[c.next]] = reply_message(self.masker, rep)
            c.next += 1

    def rewrite(self, convs: list[Conversation]) -> list[list[dict]]:
        """Each conversation rewritten on its own, one after the other (no wavefront)."""
        out = []
        for i, conv in enumerate(convs):
            c = open_conversation(i, 0, conv)
            while not c.closed:
                self.round([c])
            out.append(c.msgs)
        return out

    def close(self) -> None:
        self.engine.close()


def _conversation(rec):
    if isinstance(rec, BadLine):
        raise BadRecord("malformed JSON", f"malformed JSON ({rec.error})")
    if not isinstance(rec, dict):
        raise BadRecord("not a JSON object", f"expected a JSON object, got {type(rec).__name__}")
    return conversation_from_record(rec)


def regenerate(target: str, inp: str, out: str, *, batch_size: int = 32, max_new_tokens: int = 1024,
               device: str = "auto", thinking: str = "on", engine: EngineSpec | None = None,
               sampling: Sampling | None = None, max_model_len: int | None = None, progress=None,
               rewriter: "Rewriter | None" = None):
    """Rewrite ``inp`` into ``out``; returns (samples written now, samples already done).
    ``rewriter``: one already opened (with the same sampling and thinking), used and left
    open; by default one is opened at the first round and closed at the end."""
    if batch_size < 1:
        raise TrainerConfigError("--batch-size: must be >= 1")
    if thinking not in ("on", "off"):
        raise TrainerConfigError(f"--thinking: {thinking!r}; expected on or off")
    if not os.path.exists(inp):
        raise DataError(f"--in: {inp}: no such file")
    sampling = sampling or Sampling(max_new_tokens)
    if sampling.max_new_tokens < 1:
        raise TrainerConfigError("--max-new-tokens: must be >= 1")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
        raise TrainerConfigError("--temperature must be >= 0 and --top-p in (0, 1]")
    spec = engine or EngineSpec(device=device, batch_size=batch_size)
    check_spec(spec)
    template_kwargs = {"enable_thinking": thinking == "on"}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = RegenMeta(thinking=thinking, target=os.path.abspath(target), sampling=sampling.record())
    write_meta(out, meta)  # a resume in the other mode fails here, before any model load
    done = done_indices(out)
    rw = rewriter  # else opened at the first round: a finished output costs no model load
    prog = progress or Progress(count_records(inp) if os.path.isfile(inp) else None, "regenerate")
    prog.update(0)
    written = skipped = 0
    records = iter(enumerate(iter_records(inp, skip_bad=True)))
    exhausted = recorded = False
    waiting: deque[Open] = deque()   # admitted, in index order, until written
    try:
        with open(out, "ab") as fo:
            while True:
                while not exhausted and sum(not c.closed for c in waiting) < batch_size \
                        and len(waiting) < WAITING * batch_size:
                    nxt = next(records, None)
                    if nxt is None:
                        exhausted = True
                        break
                    idx, (line, rec) = nxt
                    if idx in done:
                        skipped += 1
                        prog.update(1, skipped=True)
                        continue
                    prog.summary.records += 1
                    try:
                        conv = _conversation(rec)
                    except BadRecord as e:
                        prog.summary.drop(e.reason, f"{inp}:{line}", f"{inp}:{line}: {e}")
                        prog.update(1)
                        continue
                    waiting.append(open_conversation(idx, line, conv))
                active = [c for c in waiting if not c.closed]
                if active:
                    if rw is None:
                        rw = Rewriter(target, spec, sampling, template_kwargs, max_model_len)
                    if not recorded:  # the engine that writes to the output, once
                        write_meta(out, RegenMeta(**{**asdict(meta), "engines": (asdict(rw.engine.info),)}))
                        recorded = True
                    rw.round(active, on_reply=lambda r: prog.update(0, tokens=r.tokens))
                n = 0
                while waiting and waiting[0].closed:
                    c = waiting.popleft()
                    if c.dropped is not None:
                        reason, msg = c.dropped
                        prog.summary.drop(reason, f"{inp}:{c.line}", f"{inp}:{c.line}: {msg}")
                    else:
                        prog.summary.kept += 1
                        fo.write((json.dumps(c.row(), ensure_ascii=False) + "\n").encode())
                        n += 1
                    prog.update(1)
                if n:
                    fo.flush()
                    os.fsync(fo.fileno())
                    written += n
                if exhausted and not waiting:
                    break
    finally:
        if rw is not None and rewriter is None:
            rw.close()
    prog.close()
    return written, skipped
