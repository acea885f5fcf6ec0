"""Defaults that depend on the target's model family (read from its config.json).

The drafter needs a mask token id that the target never produces. Qwen3's tokenizer defines
no mask token; its vocabulary ends at 151668 (``</think>``) while the embedding has 151936
rows, so 151669 is the first id that no text tokenizes to. z-lab's DFlash drafters for
Qwen3 targets use it, and so does dfo when ``--model.mask_token_id`` is not given and the
tokenizer has no mask token. Qwen2/Qwen2.5 tokenizers end earlier (151664), so the same id is
unused there too.
"""

from __future__ import annotations

import json
import os

UNUSED_MASK_IDS = {"qwen3": 151669, "qwen3_moe": 151669, "qwen2": 151669, "qwen2_moe": 151669}


def model_type(target_path: str) -> str | None:
    p = os.path.join(target_path, "config.json")
    try:
        with open(p) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    mt = cfg.get("model_type")
    return mt if isinstance(mt, str) else None


def family_mask_token_id(target_path: str, vocab_size: int, tokenizer_len: int | None = None):
    """(id, one-line note) for a known family whose id fits this target, else None.

    ``tokenizer_len``: ``len(tokenizer)`` when the target has one; the id must be past it
    (a tokenizer that uses the id, e.g. a fine-tune that added tokens, gets no default)."""
    if not target_path:
        return None
    mt = model_type(target_path)
    mid = UNUSED_MASK_IDS.get(mt or "")
    if mid is None or mid >= vocab_size or (tokenizer_len is not None and tokenizer_len > mid):
        return None
    note = (f"model: the target ({mt}) has no mask token; using id {mid}, which its tokenizer "
            "leaves unused (docs/trainer.md, Chat data; --model.mask_token_id to choose another)")
    return mid, note
