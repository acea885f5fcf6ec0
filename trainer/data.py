"""Training data: tokenized JSONL, chat JSONL, deterministic order, bucketed collation.

Formats (one JSON object per line; ``data.format`` auto-detects per line):

- tokens: ``{"input_ids": [int, ...], "loss_mask": [0|1, ...]}`` (same length).
- chat: ``{"messages": [{"role": "user"|"assistant"|..., "content": str}, ...]}``, tokenized
  with the target directory's tokenizer and chat template; loss only on assistant turns.

The file is scanned once at start: every line is validated (a malformed line, a missing
field, a token id >= the target's vocab gives a ``DataError`` naming ``file:line``; the
file is never modified) and samples with fewer than ``2*B`` loss tokens (after truncation
to ``data.max_seq_len``) are dropped and counted. Samples are re-read by byte offset.

Order: sample position p (a global counter) maps to epoch ``p // n`` and to index
``perm(seed, epoch)[p % n]``; ``perm`` is a seeded shuffle, so the order is a pure function
of (seed, epoch) and resuming needs only p. Anchors of micro-batch m are drawn with a
generator seeded by (seed, m): also a pure function.

``python -m trainer.data synth --out FILE.jsonl [--num N --seq-len S --vocab V --seed K]``
writes a learnable synthetic tokenized dataset (arithmetic token runs with a per-sample
stride, a masked prompt, rare random jumps).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass

from dfo_contract.exitcodes import DataError
from dfo_contract.fsio import atomic_write_text


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]


@dataclass(frozen=True)
class ScanReport:
    path: str
    lines: int
    kept: int
    dropped_short: int
    truncated: int
    mask_token_hits: int


class JsonlDataset:
    """A validated JSONL dataset, read lazily by byte offset."""

    def __init__(self, path: str, *, vocab_size: int, block_size: int, max_seq_len: int,
                 min_loss_tokens: int | None = None, fmt: str = "auto", tokenizer=None,
                 mask_token_id: int | None = None):
        self.path = path
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.min_loss_tokens = 2 * block_size if min_loss_tokens is None else min_loss_tokens
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.mask_token_id = mask_token_id
        self.offsets: list[int] = []
        self.linenos: list[int] = []
        self._fh = None
        self.report = self._scan()

    # -- scanning ---------------------------------------------------------------------------
    def _where(self, lineno: int) -> str:
        return f"data: {self.path}:{lineno}"

    def _scan(self) -> ScanReport:
        if not os.path.isfile(self.path):
            raise DataError(f"data: {self.path}: no such file (set --data.path; "
                            "python -m trainer.data synth --out FILE writes a synthetic one)")
        lines = dropped = truncated = hits = 0
        with open(self.path, "rb") as f:
            offset = 0
            for lineno, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                lines += 1
                s = self._parse(raw, lineno, truncate=False)
                if len(s.input_ids) > self.max_seq_len:
                    truncated += 1
                    s = self._truncate(s)
                if self.mask_token_id is not None and self.mask_token_id in s.input_ids:
                    hits += 1
                if sum(s.loss_mask) < self.min_loss_tokens:
                    dropped += 1
                    continue
                self.offsets.append(start)
                self.linenos.append(lineno)
        if not self.offsets:
            raise DataError(f"data: {self.path}: no usable samples ({lines} lines, {dropped} with "
                            f"fewer than {self.min_loss_tokens} loss tokens); check loss_mask or "
                            "lower --data.min_loss_tokens")
        return ScanReport(self.path, lines, len(self.offsets), dropped, truncated, hits)

    def _truncate(self, s: Sample) -> Sample:
        if len(s.input_ids) <= self.max_seq_len:
            return s
        return Sample(s.input_ids[: self.max_seq_len], s.loss_mask[: self.max_seq_len])

    def _parse(self, raw: bytes, lineno: int, truncate: bool = True) -> Sample:
        where = self._where(lineno)
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{where}: malformed JSON ({e.msg if hasattr(e, 'msg') else e}); "
                            "fix or remove the line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        fmt = self.fmt
        if fmt == "auto":
            fmt = "chat" if "messages" in obj and "input_ids" not in obj else "tokens"
        s = self._parse_chat(obj, where) if fmt == "chat" else self._parse_tokens(obj, where)
        return self._truncate(s) if truncate else s

    def _parse_tokens(self, obj: dict, where: str) -> Sample:
        for key in ("input_ids", "loss_mask"):
            if key not in obj:
                raise DataError(f"{where}: missing field {key!r} (tokenized lines need "
                                "input_ids and loss_mask; chat lines need messages)")
        ids, mask = obj["input_ids"], obj["loss_mask"]
        if not isinstance(ids, list) or not ids:
            raise DataError(f"{where}: input_ids must be a non-empty list of token ids")
        if not isinstance(mask, list) or len(mask) != len(ids):
            raise DataError(f"{where}: loss_mask must be a list as long as input_ids "
                            f"({len(ids)}), got {len(mask) if isinstance(mask, list) else type(mask).__name__}")
        for j, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise DataError(f"{where}: input_ids[{j}] = {t!r} is not a token id (integer >= 0)")
            if t >= self.vocab_size:
                raise DataError(f"{where}: input_ids[{j}] = {t} >= the target's vocab size "
                                f"{self.vocab_size}; tokenize with the target's tokenizer")
        out_mask = []
        for j, m in enumerate(mask):
            if isinstance(m, str | list | dict) or m not in (0, 1):
                raise DataError(f"{where}: loss_mask[{j}] = {m!r}; expected 0 or 1")
            out_mask.append(int(m))
        return Sample(list(ids), out_mask)

    def _parse_chat(self, obj: dict, where: str) -> Sample:
        msgs = obj.get("messages")
        if msgs is None:
            raise DataError(f"{where}: missing field 'messages' (chat lines need messages)")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs):
            raise DataError(f"{where}: messages must be a non-empty list of "
                            "{\"role\": str, \"content\": str} objects")
        if self.tokenizer is None:
            raise DataError(f"{where}: chat data needs the target's tokenizer, and "
                            "--model.target_path has none; pre-tokenize the data")
        ids, mask = tokenize_chat(self.tokenizer, msgs, where)
        s = Sample(ids, mask)
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            raise DataError(f"{where}: the tokenizer produced id {bad[0]} >= the target's vocab "
                            f"size {self.vocab_size}; the tokenizer does not match the target")
        return s

    # -- access -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.offsets)

    def get(self, i: int) -> Sample:
        if self._fh is None:
            self._fh = open(self.path, "rb")
        self._fh.seek(self.offsets[i])
        return self._parse(self._fh.readline(), self.linenos[i])

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def tokenize_chat(tokenizer, messages: list[dict], where: str = "data") -> tuple[list[int], list[int]]:
    """Token ids and an assistant-only loss mask for one conversation.

    Uses the template's ``{% generation %}`` markers when it has them; otherwise renders
    growing prefixes of the conversation and marks the tokens each assistant turn adds
    (requires a prefix-stable template, else a DataError asks to pre-tokenize).
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    if not template:
        raise DataError(f"{where}: the target's tokenizer has no chat template; pre-tokenize the data")
    if "generation" in template:
        r = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
        return list(r["input_ids"]), [int(x) for x in r["assistant_masks"]]

    def render(msgs):
        r = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True)
        return list(r["input_ids"])

    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(messages):
        full = render(messages[: i + 1])
        if full[: len(ids)] != ids:
            raise DataError(f"{where}: the chat template is not prefix-stable (turn {i} rewrites "
                            "earlier tokens); pre-tokenize the data with input_ids/loss_mask")
        new = full[len(ids):]
        ids.extend(new)
        mask.extend([1 if m["role"] == "assistant" else 0] * len(new))
    return ids, mask


def load_tokenizer(path: str):
    """The tokenizer in a target directory, or None when it has none."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


# --------------------------------------------------------------------------- order

class Order:
    """Deterministic sample order by (seed, epoch): position p -> dataset index."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._cache: dict[int, list[int]] = {}

    def perm(self, epoch: int) -> list[int]:
        p = self._cache.get(epoch)
        if p is None:
            p = list(range(self.n))
            if self.shuffle:
                random.Random(f"dfo-data:{self.seed}:{epoch}").shuffle(p)
            self._cache = {epoch: p}
        return p

    def index(self, position: int) -> tuple[int, int]:
        """(epoch, dataset index) of sample position ``position``."""
        epoch, k = divmod(position, self.n)
        return epoch, self.perm(epoch)[k]


# --------------------------------------------------------------------------- collation

def pick_bucket(need: int, buckets: list[int], what: str) -> int:
    for b in sorted(buckets):
        if b >= need:
            return b
    raise DataError(f"data: a batch needs {what} {need} > the largest bucket {max(buckets)}")


def anchor_seed(seed: int, micro_index: int) -> int:
    return (int(seed) * 1_000_003 + int(micro_index) * 7919 + 17) % (2**63 - 1)


def collate(samples: list[Sample], *, block_size: int, num_anchors: int, seq_buckets: list[int],
            anchor_buckets: list[int], seed: int, micro_index: int, pad_id: int = 0):
    """Pad a micro-batch into its (seq_len, anchors) bucket and draw its anchors."""
    import torch

    from .objective import eligible_anchors, sample_anchors
    from .batch import Batch

    lengths = [len(s.input_ids) for s in samples]
    s_len = pick_bucket(max(lengths), seq_buckets, "seq_len")
    b = len(samples)
    ids = torch.full((b, s_len), pad_id, dtype=torch.long)
    lm = torch.zeros((b, s_len), dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids, dtype=torch.long)
        lm[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    lens = torch.tensor(lengths, dtype=torch.long)
    need = min(num_anchors, int(eligible_anchors(lm, lens, block_size).sum(1).max()))
    n_bucket = pick_bucket(max(need, 1), anchor_buckets, "anchors")
    g = torch.Generator(device="cpu").manual_seed(anchor_seed(seed, micro_index))
    anchors, valid = sample_anchors(lm, lens, min(num_anchors, n_bucket), block_size, generator=g)
    if anchors.shape[1] < n_bucket:
        pad = n_bucket - anchors.shape[1]
        anchors = torch.nn.functional.pad(anchors, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad))
    return Batch(input_ids=ids, loss_mask=lm, lengths=lens, anchors=anchors, anchor_valid=valid,
                 num_tokens=int(sum(lengths)), num_samples=b)


class BatchStream:
    """Micro-batches in a deterministic order; its state is one integer (micro-batches done)."""

    def __init__(self, ds: JsonlDataset, *, micro_batch: int, block_size: int, num_anchors: int,
                 seq_buckets: list[int], anchor_buckets: list[int], seed: int, shuffle: bool = True,
                 pad_id: int = 0):
        self.ds = ds
        self.micro_batch = micro_batch
        self.kw = dict(block_size=block_size, num_anchors=num_anchors, seq_buckets=seq_buckets,
                       anchor_buckets=anchor_buckets, seed=seed, pad_id=pad_id)
        self.order = Order(len(ds), seed, shuffle)
        self.micro_index = 0

    def next(self):
        m = self.micro_index
        samples = []
        for p in range(m * self.micro_batch, (m + 1) * self.micro_batch):
            _, i = self.order.index(p)
            samples.append(self.ds.get(i))
        self.micro_index += 1
        return collate(samples, micro_index=m, **self.kw)

    def state_dict(self) -> dict:
        pos = self.micro_index * self.micro_batch
        return {"micro_index": self.micro_index, "sample_position": pos,
                "epoch": pos // len(self.ds), "num_samples": len(self.ds),
                "micro_batch": self.micro_batch}

    def load_state_dict(self, st: dict) -> None:
        self.micro_index = int(st["micro_index"])


# --------------------------------------------------------------------------- synth

def synth_samples(num: int, seq_len: int, vocab: int, seed: int, *, reserve: int = 4,
                  min_len: int | None = None, jump_p: float = 0.03):
    """Learnable sequences: x[t+1] = x[t] + stride (mod the usable vocab), stride per sample."""
    rng = random.Random(f"dfo-synth:{seed}")
    span = vocab - reserve
    if span < 8:
        raise ValueError("synth: --vocab must leave at least 8 usable ids above the reserved ones")
    lo = min_len if min_len is not None else max(2, seq_len // 2)
    for _ in range(num):
        n = rng.randint(lo, seq_len)
        stride = rng.randint(1, 3)
        x = rng.randrange(span)
        ids = []
        for _t in range(n):
            ids.append(reserve + x)
            x = rng.randrange(span) if rng.random() < jump_p else (x + stride) % span
        prompt = rng.randint(1, max(1, n // 4))
        yield {"input_ids": ids, "loss_mask": [0] * prompt + [1] * (n - prompt)}


def write_synth(out: str, *, num: int, seq_len: int, vocab: int, seed: int, reserve: int = 4) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(s, separators=(",", ":")) + "\n"
                                   for s in synth_samples(num, seq_len, vocab, seed, reserve=reserve)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.data")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("synth", help="write a synthetic tokenized JSONL dataset")
    sp.add_argument("--out", required=True)
    sp.add_argument("--num", type=int, default=256)
    sp.add_argument("--seq-len", type=int, default=64)
    sp.add_argument("--vocab", type=int, default=128)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--reserve", type=int, default=4,
                    help="ids below this are never used (specials; the tiny target's mask is 3)")
    a = ap.parse_args(argv)
    try:
        write_synth(a.out, num=a.num, seq_len=a.seq_len, vocab=a.vocab, seed=a.seed, reserve=a.reserve)
    except ValueError as e:
        print(f"trainer.data: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.num} synthetic samples to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
