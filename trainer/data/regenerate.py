"""The target rewrites the assistant turns of a chat dataset (greedy, batched, resumable).

Drafters trained on the target's own outputs accept more. For every conversation, each
assistant turn in order is replaced by the target's greedy reply to the conversation so far
(earlier turns already rewritten). Assistant turns that carry ``tool_calls`` are kept as they
are (the tool results after them answer those exact calls).

The output is JSONL, appended to: one line per conversation
``{"index": i, "line": L, "messages": [...], "tools": [...]?}`` (``i`` counts records of the
input from 0), flushed and fsynced after each batch. A rerun reads the output, drops a torn
last line, and skips every index already there: kill it at any point and run it again.

``thinking`` ("on"/"off") is passed to the chat template as ``enable_thinking`` when the
generation prompt is rendered, and recorded in ``OUT.meta.json`` (trainer.data.meta); resuming
an output in the other mode is a data error. Records that cannot be read (malformed JSON, not
a conversation) are skipped and counted in ``progress.summary`` with file:line.
"""

from __future__ import annotations

import json
import os

from dfo_contract.exitcodes import DataError

from .chat import ChatMasker, Unmaskable, regenerated_message
from .formats import BadLine, count_records, iter_records
from .meta import RegenMeta, write_meta
from .records import BadRecord, conversation_from_record
from .progress import Progress
from .tokenizer import load_tokenizer


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


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Rewriter:
    def __init__(self, target: str, device: str, max_new_tokens: int, template_kwargs: dict):
        import torch

        from ..model.hf_load import from_pretrained, quiet_transformers

        quiet_transformers()
        tok = load_tokenizer(target)
        if tok is None:
            raise DataError(f"--target: {target}: no tokenizer; regenerate needs the target's tokenizer")
        try:
            self.masker = ChatMasker(tok, template_kwargs=template_kwargs)
        except Unmaskable as e:
            raise DataError(f"--target: {target}: {e}") from None
        self.tok, self.kw = tok, dict(template_kwargs)
        self.dev = _device(device)
        dtype = torch.bfloat16 if self.dev.type == "cuda" else torch.float32
        self.model = from_pretrained(target, dtype)
        self.model.to(self.dev).eval()
        self.max_new = max_new_tokens
        self.eot = tok.convert_tokens_to_ids(self.masker.end_of_turn)
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else self.eot

    def generate(self, prompts: list[str]) -> list[str]:
        import torch

        enc = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        n = max(len(e) for e in enc)
        ids = torch.full((len(enc), n), self.pad, dtype=torch.long)
        att = torch.zeros((len(enc), n), dtype=torch.long)
        for i, e in enumerate(enc):  # left padding
            ids[i, n - len(e):] = torch.tensor(e)
            att[i, n - len(e):] = 1
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.dev), attention_mask=att.to(self.dev),
                                      max_new_tokens=self.max_new, do_sample=False,
                                      eos_token_id=self.eot, pad_token_id=self.pad)
        texts = []
        for row in out[:, n:].tolist():
            if self.eot in row:
                row = row[: row.index(self.eot)]
            texts.append(self.tok.decode(row, skip_special_tokens=True))
        return texts

    def rewrite(self, convs: list) -> list[list[dict]]:
        msgs = [[dict(m) for m in c.messages] for c in convs]
        turns = [[k for k, m in enumerate(ms) if m["role"] == "assistant" and not m.get("tool_calls")]
                 for ms in msgs]
        for t in range(max((len(x) for x in turns), default=0)):
            todo = [(i, turns[i][t]) for i in range(len(msgs)) if t < len(turns[i])]
            prompts = [generation_prompt(self.tok, msgs[i][:k], convs[i].tools, self.kw) for i, k in todo]
            for (i, k), text in zip(todo, self.generate(prompts), strict=True):
                msgs[i][k] = regenerated_message(self.masker, text)
        return msgs


def _conversation(rec):
    if isinstance(rec, BadLine):
        raise BadRecord("malformed JSON", f"malformed JSON ({rec.error})")
    if not isinstance(rec, dict):
        raise BadRecord("not a JSON object", f"expected a JSON object, got {type(rec).__name__}")
    return conversation_from_record(rec)


def regenerate(target: str, inp: str, out: str, *, batch_size: int = 32, max_new_tokens: int = 1024,
               device: str = "auto", thinking: str = "on", progress=None):
    """Rewrite ``inp`` into ``out``; returns (samples written now, samples already done)."""
    if batch_size < 1:
        raise DataError("--batch-size: must be >= 1")
    if thinking not in ("on", "off"):
        raise DataError(f"--thinking: {thinking!r}; expected on or off")
    if not os.path.exists(inp):
        raise DataError(f"--in: {inp}: no such file")
    template_kwargs = {"enable_thinking": thinking == "on"}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_meta(out, RegenMeta(thinking=thinking, target=os.path.abspath(target)))
    done = done_indices(out)
    rw = None  # loaded at the first batch: a finished output costs no model load
    prog = progress or Progress(count_records(inp) if os.path.isfile(inp) else None, "regenerate")
    prog.update(0)
    written = skipped = 0
    with open(out, "ab") as fo:
        batch: list = []

        def flush():
            nonlocal written
            nonlocal rw
            if not batch:
                return
            if rw is None:
                rw = Rewriter(target, device, max_new_tokens, dict(template_kwargs or {}))
            new = rw.rewrite([c for _, _, c in batch])
            for (idx, line, conv), ms in zip(batch, new, strict=True):
                rec = {"index": idx, "line": line, "messages": ms}
                if conv.tools is not None:
                    rec["tools"] = conv.tools
                fo.write((json.dumps(rec, ensure_ascii=False) + "\n").encode())
            fo.flush()
            os.fsync(fo.fileno())
            written += len(batch)
            prog.update(len(batch))
            batch.clear()

        for idx, (line, rec) in enumerate(iter_records(inp, skip_bad=True)):
            if idx in done:
                skipped += 1
                prog.update(1)
                continue
            prog.summary.records += 1
            try:
                conv = _conversation(rec)
            except BadRecord as e:
                prog.summary.drop(e.reason, f"{inp}:{line}", f"{inp}:{line}: {e}")
                prog.update(1)
                continue
            prog.summary.kept += 1
            batch.append((idx, line, conv))
            if len(batch) >= batch_size:
                flush()
        flush()
    prog.close()
    return written, skipped
