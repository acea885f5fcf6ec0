"""``python -m trainer.data synth``: a learnable synthetic tokenized dataset."""

from __future__ import annotations

import json
import os
import random

from dfo_contract.fsio import atomic_write_text


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
