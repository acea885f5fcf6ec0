"""Chat data end to end: readers (.jsonl, .jsonl.gz, .parquet), drops with reasons,
``python -m trainer.data tokenize`` into a store that data.path reads, training on it,
and the family mask-token default."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from dfo_contract.exitcodes import DataError, TrainerConfigError
from dfo_contract.fsio import sha256_file
from tests.fixtures.chat.tokenizer import install, qwen3_like_tokenizer
from tests.helpers.trainer import REPO, make_target, run_trainer, tiny_overrides
from trainer.data.chat import ChatMasker
from trainer.data.datasets import JsonlDataset, TokenizedDataset, open_dataset

B = 4


def chat(i: int, turns: int = 2) -> dict:
    msgs = [{"role": "system", "content": "count"}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"from {i + t}"})
        msgs.append({"role": "assistant", "content": " ".join(str(i + t + k) for k in range(8)),
                     "reasoning_content": f"step {t}"})
    return {"messages": msgs}


def sharegpt(i: int) -> dict:
    return {"conversations": [{"from": "human", "value": f"go {i}"},
                              {"from": "gpt", "value": f"{i} {i + 1} {i + 2} {i + 3} {i + 4}"}]}


RECORDS = [chat(0), sharegpt(1), {"messages": [{"role": "user", "content": "alone"}]},
           {"input_ids": [20 + k for k in range(30)], "loss_mask": [0] * 10 + [1] * 20},
           chat(5, turns=1), sharegpt(7), chat(9, turns=3)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return install(make_target(str(tmp_path_factory.mktemp("t") / "target"), layers=2))


@pytest.fixture(scope="module")
def masker():
    return ChatMasker(qwen3_like_tokenizer())


def write_jsonl(path, rows, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)
    return str(path)


def ds(path, masker, **kw):
    return open_dataset(str(path), vocab_size=128, block_size=B, max_seq_len=kw.pop("max_seq_len", 512),
                        masker=masker, **kw)


def samples(d):
    return [(d.get(i).input_ids, d.get(i).loss_mask) for i in range(len(d))]


def test_jsonl_drops_unmaskable_with_reason_and_line(tmp_path, masker):
    d = ds(write_jsonl(tmp_path / "c.jsonl", RECORDS), masker)
    r = d.report
    assert len(d) == 6 and r.lines == 7
    assert r.dropped == {"cannot mask: no assistant message": 1}
    assert r.first_dropped["cannot mask: no assistant message"].endswith("c.jsonl:3")
    assert "1 dropped: cannot mask: no assistant message (first at " in r.describe(2 * B)


def test_chat_is_tokenized_once_at_load(tmp_path, masker):
    d = ds(write_jsonl(tmp_path / "c.jsonl", RECORDS), masker)
    before = samples(d)
    d._masker = None  # reads after the scan never touch the tokenizer
    d.tokenizer = None
    assert samples(d) == before


def test_gzip_and_parquet_read_the_same(tmp_path, masker):
    want = samples(ds(write_jsonl(tmp_path / "c.jsonl", RECORDS), masker))
    assert samples(ds(write_jsonl(tmp_path / "c.jsonl.gz", RECORDS, gz=True), masker)) == want
    pa = pytest.importorskip("pyarrow", reason="pyarrow absent: parquet untested here (the dev "
                             "extra installs it)")
    import pyarrow.parquet as pq

    for name, rows in (("openai", [chat(0), chat(5, turns=1), chat(9, turns=3)]),
                       ("sharegpt", [sharegpt(1), sharegpt(7)])):  # one schema per parquet file
        pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / f"{name}.parquet"))
        want = samples(ds(write_jsonl(tmp_path / f"{name}.jsonl", rows), masker))
        assert samples(ds(tmp_path / f"{name}.parquet", masker)) == want


def test_parquet_without_pyarrow_is_one_line(tmp_path, masker, monkeypatch):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"x.parquet: reading parquet needs pyarrow.*\.jsonl\)$"):
        ds(p, masker)


def test_every_sample_dropped_says_why(tmp_path, masker):
    p = write_jsonl(tmp_path / "none.jsonl", [{"messages": [{"role": "user", "content": "q"}]}] * 3)
    with pytest.raises(DataError) as ei:
        ds(p, masker)
    msg = str(ei.value)
    assert "3 dropped: cannot mask: no assistant message (first at " in msg and "none.jsonl:1" in msg
    assert "min_loss_tokens" not in msg and "\n" not in msg  # no knob that cannot help
    short = write_jsonl(tmp_path / "short.jsonl", [sharegpt(1)])
    with pytest.raises(DataError, match="fewer than 64 loss tokens .lower --data.min_loss_tokens"):
        ds(short, masker, min_loss_tokens=64)


def tokenize(target, inputs, out, *extra):
    return subprocess.run([sys.executable, "-m", "trainer.data", "tokenize", "--target", target,
                           "--in", *inputs, "--out", out, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_tokenize_store_matches_jsonl_and_trains(tmp_path, target, masker):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    b = write_jsonl(tmp_path / "b.jsonl.gz", [chat(20 + i) for i in range(40)], gz=True)
    out = str(tmp_path / "store")
    r = tokenize(target, [a, b], out, "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "samples: 46 kept of 47 records" in r.stdout
    assert f"dropped 1: cannot mask: no assistant message (first: {a}:3)" in r.stdout
    assert "lengths: " in r.stdout and "tokenize: 47/47" in r.stderr  # plain progress (no tty)
    m = json.load(open(os.path.join(out, "manifest.json")))
    for name, digest in m["files"].items():
        assert sha256_file(os.path.join(out, name)) == digest
    assert m["inputs"][1]["sha256"] == sha256_file(b)
    st = ds(out, masker)
    assert isinstance(st, TokenizedDataset)
    want = samples(ds(a, masker)) + samples(ds(b, masker))
    assert samples(st) == want
    assert st.store.where(int(st.index[2])).endswith("a.jsonl:4")
    assert st.report.mask_token_hits == 0
    # truncation and the loss-token filter are applied at load, vectorised
    st2 = ds(out, masker, max_seq_len=40, min_loss_tokens=8)
    js2 = [(i[:40], lm[:40]) for i, lm in want if sum(lm[:40]) >= 8]
    assert samples(st2) == js2 and st2.report.truncated > 0
    # training reads the store directly
    run = run_trainer(["train", *tiny_overrides(target, out, str(tmp_path / "run"), **{
        "model.block_size": B, "data.max_seq_len": 256, "train.max_steps": 2, "train.micro_batch": 2,
        "model.target_layer_ids": "[0]"})])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "46 samples" in run.stdout


def test_torn_store_and_wrong_target(tmp_path, target, masker):
    out = str(tmp_path / "store")
    assert tokenize(target, [write_jsonl(tmp_path / "a.jsonl", RECORDS)], out, "--workers", "1").returncode == 0
    with pytest.raises(DataError, match="vocab size 50; the store was tokenized for another target"):
        open_dataset(out, vocab_size=50, block_size=B, max_seq_len=512)
    p = os.path.join(out, "tokens.u32")
    os.truncate(p, os.path.getsize(p) - 4)
    with pytest.raises(DataError, match=r"tokens.u32: \d+ bytes, the manifest says \d+ .torn"):
        ds(out, masker)


def test_tokenize_all_dropped_exits_3(tmp_path, target):
    p = write_jsonl(tmp_path / "n.jsonl", [{"messages": [{"role": "user", "content": "q"}]}])
    r = tokenize(target, [p], str(tmp_path / "s"), "--workers", "1")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 3 and not os.path.exists(tmp_path / "s")
    assert last.startswith("trainer.data: data: ") and "no usable samples of 1 records" in last
    assert "no assistant message" in last and "n.jsonl:1" in last and "min_loss_tokens" not in last


def test_jsonl_dataset_still_lazy_for_tokens(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [RECORDS[3]] * 3)
    d = JsonlDataset(p, vocab_size=128, block_size=B, max_seq_len=64)
    assert d._mem == {} and d.get(2).input_ids[0] == 20


# --------------------------------------------------------------------------- mask token default

def fake_target(tmp_path, model_type, vocab):
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": vocab}))
    return SimpleNamespace(path=str(d), vocab_size=vocab)


def test_family_mask_token_default(tmp_path, caplog):
    from dfo_contract.trainer_config import TrainerConfig
    from trainer.core.step import mask_token_id

    cfg = TrainerConfig()
    with caplog.at_level(logging.WARNING, logger="dfo"):
        assert mask_token_id(cfg, fake_target(tmp_path, "qwen3", 151936)) == 151669
    notes = [r.getMessage() for r in caplog.records if "151669" in r.getMessage()]
    assert len(notes) == 1 and "(qwen3) has no mask token" in notes[0] and "\n" not in notes[0]
    assert mask_token_id(cfg, fake_target(tmp_path, "qwen3_moe", 151936)) == 151669
    for mt, vocab in (("llama", 128256), ("qwen2", 1000)):  # unknown family / id out of range
        with pytest.raises(TrainerConfigError, match="mask_token_id: required"):
            mask_token_id(cfg, fake_target(tmp_path, mt, vocab))
    cfg.model.mask_token_id = 7
    assert mask_token_id(cfg, fake_target(tmp_path, "qwen2_moe", 151936)) == 7


def test_mask_token_hits_counted_in_store(tmp_path, target, masker):
    p = write_jsonl(tmp_path / "a.jsonl", [RECORDS[3], {"input_ids": [3] * 30, "loss_mask": [1] * 30}])
    out = str(tmp_path / "s")
    assert tokenize(target, [p], out, "--workers", "1").returncode == 0
    st = open_dataset(out, vocab_size=128, block_size=B, max_seq_len=64, mask_token_id=3)
    assert st.report.mask_token_hits == 1
    assert np.array_equal(st.store.ids(1), np.full(30, 3, dtype=np.uint32))
