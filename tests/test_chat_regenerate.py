"""``python -m trainer.data regenerate``: the target rewrites assistant turns (CPU, tiny
random target), output appended with the sample index, resumable after a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures.chat.tokenizer import install
from tests.helpers.trainer import REPO, make_target
from trainer.data.regenerate import done_indices, regenerate


def convo(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"orig{i}"},
                         {"role": "user", "content": f"again{i}"},
                         {"role": "assistant", "content": f"orig-second{i}"}]}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return install(make_target(str(tmp_path_factory.mktemp("t") / "target"), layers=2))


def rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_regenerate_rewrites_every_assistant_turn(tmp_path, target):
    src = tmp_path / "in.jsonl"
    recs = [convo(i) for i in range(5)] + [{"conversations": [{"from": "human", "value": "sg"},
                                                              {"from": "gpt", "value": "orig-sg"}]}]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "out.jsonl"
    n, skipped = regenerate(target, str(src), str(out), batch_size=4, max_new_tokens=6, device="cpu")
    assert (n, skipped) == (6, 0)
    got = rows(out)
    assert [r["index"] for r in got] == list(range(6)) and [r["line"] for r in got] == list(range(1, 7))
    for r, rec in zip(got, recs, strict=True):
        src_msgs = rec.get("messages") or [{"role": "user", "content": "sg"}, {"role": "assistant"}]
        assert [m["role"] for m in r["messages"]] == [m["role"] for m in src_msgs]
        for m, s in zip(r["messages"], src_msgs, strict=True):
            if m["role"] == "user":
                assert m["content"] == s["content"]
            else:
                assert not m["content"].startswith("orig") and "<|im_end|>" not in m["content"]
    # greedy: a second run from scratch writes the same text
    out2 = tmp_path / "out2.jsonl"
    regenerate(target, str(src), str(out2), batch_size=4, max_new_tokens=6, device="cpu")
    assert rows(out2) == got
    # a finished output is skipped whole
    assert regenerate(target, str(src), str(out), batch_size=4, max_new_tokens=6, device="cpu") == (0, 6)


def test_torn_tail_is_cut(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"index": 0, "messages": []}\n{"index": 1, "messages": []}\n{"index": 2, "mes')
    assert done_indices(str(out)) == {0, 1}
    assert out.read_text().endswith('"messages": []}\n') and out.read_text().count("\n") == 2


def test_kill_and_resume(tmp_path, target):
    """The first run reads its input from a FIFO: the test feeds 4 conversations, waits until
    they are written, and SIGKILLs the process while it waits for more (no timing guess)."""
    n = 10
    recs = [convo(i) for i in range(n)]
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "trainer.data", "regenerate", "--target", target, "--out", str(out),
           "--batch-size", "2", "--max-new-tokens", "5", "--device", "cpu", "--thinking", "on"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd + ["--in", str(fifo)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "w") as w:
            w.write("".join(json.dumps(r) + "\n" for r in recs[:4]))
            w.flush()
            deadline = time.monotonic() + 240
            while not (out.exists() and out.read_text().count("\n") >= 4):
                assert p.poll() is None, p.stderr.read()
                assert time.monotonic() < deadline, "the first 4 samples were never written"
                time.sleep(0.2)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    first = out.read_text()
    assert p.returncode == -signal.SIGKILL and [r["index"] for r in rows(out)] == [0, 1, 2, 3]
    with open(out, "a") as f:  # as if killed in the middle of a write
        f.write('{"index": 4, "messa')
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = subprocess.run(cmd + ["--in", str(src)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"regenerated 6 samples into {out} (4 already done)" in r.stdout
    assert "regenerate: 10/10" in r.stderr  # plain progress lines when not a tty
    text = out.read_text()
    assert text.startswith(first)
    assert sorted(x["index"] for x in rows(out)) == list(range(n))
    # the same file as an uninterrupted run
    whole = tmp_path / "whole.jsonl"
    regenerate(target, str(src), str(whole), batch_size=2, max_new_tokens=5, device="cpu")
    assert text == whole.read_text()
