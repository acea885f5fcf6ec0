"""trainer.data: validation with file:line, dropping, deterministic order, chat, synth, collate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.trainer import REPO, make_target
from trainer.data.datasets import JsonlDataset
from trainer.data.stream import BatchStream, Order
from trainer.data.tokenizer import load_tokenizer, tokenize_chat
from dfo_contract.exitcodes import DataError

B = 8


def _write(tmp_path, lines, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(p)


def _ok(n=40, start=4):
    return {"input_ids": [start + i % 100 for i in range(n)], "loss_mask": [1] * n}


def _ds(path, **kw):
    return JsonlDataset(path, vocab_size=128, block_size=B, max_seq_len=kw.pop("max_seq_len", 64), **kw)


@pytest.mark.parametrize("bad,what", [
    ('{"input_ids": [1, 2,', "malformed JSON"),
    ({"input_ids": [5, 6, 7]}, "missing field 'loss_mask'"),
    ({"loss_mask": [1]}, "missing field 'input_ids'"),
    ({"input_ids": [5, 128], "loss_mask": [1, 1]}, "input_ids[1] = 128 >= the target's vocab size 128"),
    ({"input_ids": [5, -1], "loss_mask": [1, 1]}, "not a token id"),
    ({"input_ids": [5, 6], "loss_mask": [1]}, "as long as input_ids"),
    ({"input_ids": [5, 6], "loss_mask": [1, 2]}, "expected 0 or 1"),
    ([1, 2, 3], "expected a JSON object"),
    ({"messages": "hi"}, "messages must be"),
])
def test_bad_lines_name_file_and_line(tmp_path, bad, what):
    p = _write(tmp_path, [_ok(), _ok(), bad, _ok()])
    before = open(p).read()
    with pytest.raises(DataError) as ei:
        _ds(p)
    msg = str(ei.value)
    assert f"{p}:3:" in msg and what in msg and "\n" not in msg
    assert open(p).read() == before  # loses nothing


def test_short_samples_dropped_and_counted(tmp_path):
    short = {"input_ids": [5] * 40, "loss_mask": [0] * 30 + [1] * 10}  # 10 < 2*B loss tokens
    p = _write(tmp_path, [_ok(), short, "", _ok(), short])
    ds = _ds(p)
    assert len(ds) == 2 and ds.report.dropped_short == 2 and ds.report.lines == 4
    assert ds.linenos == [1, 4]
    with pytest.raises(DataError, match="no usable samples"):
        _ds(_write(tmp_path, [short], "s.jsonl"))


def test_truncation_and_lazy_reads(tmp_path):
    p = _write(tmp_path, [_ok(100), _ok(30, start=9)])
    ds = _ds(p, max_seq_len=64)
    assert ds.report.truncated == 1
    assert len(ds.get(0).input_ids) == 64 and ds.get(1).input_ids[0] == 9


def test_order_deterministic_by_seed_and_epoch():
    a, b, c = Order(50, seed=1), Order(50, seed=1), Order(50, seed=2)
    assert a.perm(0) == b.perm(0) and a.perm(1) == b.perm(1)
    assert a.perm(0) != a.perm(1) and a.perm(0) != c.perm(0)
    assert sorted(a.perm(3)) == list(range(50))
    assert a.index(50 + 7) == (1, a.perm(1)[7])
    assert Order(5, seed=1, shuffle=False).perm(4) == [0, 1, 2, 3, 4]


def test_stream_buckets_and_resume_state(tmp_path):
    lines = [_ok(20 + 3 * i) for i in range(10)]
    ds = _ds(_write(tmp_path, lines))
    kw = dict(micro_batch=3, block_size=B, num_anchors=6, seq_buckets=[32, 64],
              anchor_buckets=[4, 8], seed=0)
    s1 = BatchStream(ds, **kw)
    batches = [s1.next() for _ in range(5)]
    for b in batches:
        assert b.shape[0] in (32, 64) and b.shape[1] in (4, 8)
        assert int(b.anchor_valid.sum(1).max()) <= 6
        assert b.num_tokens == int(b.lengths.sum())
    st = s1.state_dict()
    assert st["micro_index"] == 5 and st["epoch"] == 1
    s2 = BatchStream(ds, **kw)
    s2.load_state_dict(json.loads(json.dumps(st)))
    x, y = s1.next(), s2.next()
    assert (x.input_ids == y.input_ids).all() and (x.anchors == y.anchors).all()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(make_target(str(tmp_path_factory.mktemp("t") / "target")))


def test_chat_loss_only_on_assistant_turns(tmp_path, tok):
    msgs = [{"role": "user", "content": "add one: 3"}, {"role": "assistant", "content": "4 and then 5"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "6 7 8 9 10 11"}]
    ids, mask = tokenize_chat(tok, msgs)
    assert len(ids) == len(mask)
    on = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    off = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "4 and then 5" in on and "6 7 8 9 10 11" in on
    assert "add one" in off and "more" in off and "add one" not in on
    p = _write(tmp_path, [{"messages": msgs}, {"messages": msgs[:2]}])
    ds = JsonlDataset(p, vocab_size=128, block_size=8, max_seq_len=200, tokenizer=tok)
    assert len(ds) == 1 and ds.report.dropped_short == 1  # the short chat has < 16 loss tokens
    assert ds.get(0).loss_mask == mask


def test_chat_without_tokenizer_is_a_data_error(tmp_path):
    p = _write(tmp_path, [{"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(DataError, match=r"d.jsonl:1: chat data needs the target's tokenizer"):
        _ds(p)


def test_synth_cli(tmp_path):
    out = tmp_path / "s.jsonl"
    r = subprocess.run([sys.executable, "-m", "trainer.data", "synth", "--out", str(out), "--num", "20",
                        "--seq-len", "48", "--vocab", "128", "--seed", "3"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        assert 24 <= len(row["input_ids"]) <= 48 and len(row["loss_mask"]) == len(row["input_ids"])
        assert all(4 <= t < 128 for t in row["input_ids"])
    assert len(_ds(str(out))) > 0


def test_data_path_directory_needs_a_manifest(tmp_path):
    from trainer.data.datasets import open_dataset

    with pytest.raises(DataError, match=r"a directory without manifest.json .*python -m trainer.data tokenize"):
        open_dataset(str(tmp_path), vocab_size=128, block_size=B, max_seq_len=64)
    ds = open_dataset(_write(tmp_path, [_ok()]), vocab_size=128, block_size=B, max_seq_len=64)
    assert isinstance(ds, JsonlDataset) and ds.report.describe(16).startswith(f"data: {ds.path}: 1 samples (")
