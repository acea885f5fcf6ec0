"""``trainer.data tokenize`` on Qwen3's real tokenizer and template (shared fixtures, see
tests/helpers/qwen3.py): any number of workers writes the same store; the direct encoder
gives the tokenizer's own ids and offsets; the numpy loss mask equals the per-token scan;
loading the tokenizer imports no torch."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import qwen3
from tests.helpers.trainer import REPO
from trainer.data.chat import Unmaskable, span_mask_array
from trainer.data.tokenized import FILES

TEXTS = ["plain ascii, twice  spaced\n\nand newlines", "café naïve Ångström ﬁne",
         "e\u0301 and A\u030a (not NFC)", "日本語のテキスト 한국어 emoji 🙂👍🏽",
         "<|im_start|>assistant\n<think>\nx\u0301\n</think>\n\nok<|im_end|>", "\u212b sign", ""]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    qwen3.require_fixtures()
    return qwen3.make_target(tmp_path_factory.mktemp("qwen3-target") / "hybrid", "hybrid")


def _tokenize(target, data, out, workers):
    return subprocess.run([sys.executable, "-m", "trainer.data", "tokenize", "--target", target,
                           "--in", *data, "--out", out, "--workers", workers], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_one_and_two_workers_write_byte_identical_stores(tmp_path, target):
    """Several chunks of two files, with records dropped between kept ones."""
    good = qwen3.records()
    bad = ['{"messages": [', {"messages": [{"role": "critic", "content": "x"}]},
           {"messages": [{"role": "user", "content": "no reply"}]}]
    rows = [good[i % len(good)] if i % 37 else bad[(i // 37) % 3] for i in range(600)]
    for i, r in enumerate(rows):  # distinct contents, so misplaced samples would show
        if isinstance(r, dict) and "messages" in r and r["messages"][-1].get("role") == "assistant":
            r = json.loads(json.dumps(r))
            r["messages"][-1]["content"] = f"{r['messages'][-1]['content'] or ''} #{i}"
            rows[i] = r
    a = qwen3.write_jsonl(tmp_path / "a.jsonl", rows)
    b = qwen3.write_jsonl(tmp_path / "b.jsonl", rows[:300:-1])
    stores = {}
    for w in ("1", "2"):
        out = tmp_path / f"store-{w}"
        r = _tokenize(target, [a, b], str(out), w)
        assert r.returncode == 0, r.stderr
        stores[w] = out
    m1, m2 = (json.loads((stores[w] / "manifest.json").read_text()) for w in ("1", "2"))
    assert m1["num_samples"] > 500 and sum(m1["dropped"].values()) > 10
    for key in ("num_samples", "num_tokens", "loss_tokens", "records", "dropped", "first_dropped",
                "length_histogram", "files"):
        assert m1[key] == m2[key], key
    for f in FILES:
        assert (stores["1"] / f).read_bytes() == (stores["2"] / f).read_bytes(), f


def test_encoder_gives_the_tokenizers_own_ids_and_offsets(target):
    from trainer.data.chat import ChatMasker
    from trainer.data.tokenizer import load_tokenizer

    tok = load_tokenizer(target)
    enc = ChatMasker(tok).encoder
    assert enc.form == "NFC"  # Qwen3's normalizer: NFC text skips it
    for text in TEXTS:
        want = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc.encode(text)
        assert list(ids) == want["input_ids"], text
        assert [tuple(o) for o in offsets] == [tuple(o) for o in want["offset_mapping"]], text


def test_loading_the_tokenizer_imports_no_torch(target):
    code = ("import sys; from trainer.data.tokenizer import load_tokenizer; "
            f"t = load_tokenizer({target!r}); "
            "print(type(t).__name__, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["Qwen2Tokenizer", "False"]


def _scan(offsets, spans):
    """The per-token scan the numpy mask must equal."""
    mask, si = [0] * len(offsets), 0
    for t, (a, b) in enumerate(offsets):
        while si < len(spans) and a >= spans[si][1]:
            si += 1
        if si == len(spans):
            break
        s, e = spans[si]
        if (a < e and b > s) if b > a else (s <= a < e):
            mask[t] = 1
    return mask


def test_numpy_mask_equals_the_per_token_scan():
    rng = random.Random(7)
    for _ in range(3000):
        offsets, pos = [], 0
        for _ in range(rng.randint(0, 30)):
            step = rng.choice((0, 0, 1, 1, 2, 3))
            a = max(0, pos - rng.choice((0, 0, 0, 1)))  # shared chars, zero-length tokens
            offsets.append((a, a + step))
            pos = a + step
        cuts = sorted(rng.sample(range(pos + 3), min(pos + 3, 2 * rng.randint(0, 3))))
        spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
        want = _scan(offsets, spans)
        if not any(want):
            with pytest.raises(Unmaskable):
                span_mask_array(offsets, spans)
            continue
        got = span_mask_array(offsets, spans)
        assert got.dtype == np.uint8 and got.tolist() == want, (offsets, spans)
