"""Realistic sample lengths: generated multi-turn chats through Qwen3's real chat template and
tokenizer, as ``trainer.data tokenize`` masks them; written as a small lengths file.

    python3 bench/chat_lengths.py --out bench/results/qwen3-chat-lengths.json [--records 4000]

The chats (seeded) have a long tail, as regenerated chat data has: a system prompt; 1 to 12
user/assistant exchanges (geometric, mean 2.2); each user turn 1-6 sentences; each reply a
log-normal number of sentences (median 4, sigma 1.1: many short answers, a few very long
ones, capped at 120), prose with code blocks and lists, reasoning on half the replies and
tool calls on a quarter of the records (``bench/bench_tokenize_qwen3.py``'s text). The
records are tokenized by the real path (``python -m trainer.data tokenize`` with Qwen3's
tokenizer and hybrid template, thinking as the template renders it) and each sample's token
count and loss-mask runs are written:

    {"source": "...", "samples": [[n_tokens, [[start, end], ...]], ...]}

``bench/bench_trainer.py --lengths FILE`` trains on synthetic tokens with exactly these
lengths and loss masks. No torch, no network.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_tokenize_qwen3 import (CODE, TOOLS, make_target, paragraph,  # noqa: E402
                                        sentence)


def long_reply(rng: random.Random) -> str:
    n = min(120, max(1, int(round(math.exp(rng.gauss(math.log(4), 1.1))))))
    parts, left = [], n
    while left > 0:
        k = min(left, rng.randint(2, 6))
        parts.append(paragraph(rng, k))
        left -= k
        if rng.random() < 0.15:
            code = rng.choice(CODE).format(f=rng.choice(("score", "scale", "norm")), k=rng.randint(2, 99))
            parts.append(f"```\n{code}```")
    return "\n\n".join(parts)


def chat(rng: random.Random) -> dict:
    msgs = [{"role": "system", "content": paragraph(rng, rng.randint(1, 3))}]
    tools = rng.random() < 0.25
    exchanges = 1
    while exchanges < 12 and rng.random() < 0.55:
        exchanges += 1
    for _ in range(exchanges):
        msgs.append({"role": "user", "content": paragraph(rng, rng.randint(1, 6))})
        if tools and rng.random() < 0.4:
            t = rng.choice(TOOLS)["function"]
            arg = next(iter(t["parameters"]["properties"]))
            msgs.append({"role": "assistant", "content": "", "reasoning_content": sentence(rng, 14),
                         "tool_calls": [{"type": "function", "function": {
                             "name": t["name"], "arguments": {arg: sentence(rng, 3)}}}]})
            msgs.append({"role": "tool", "content": json.dumps({"result": sentence(rng, 12)})})
        m = {"role": "assistant", "content": long_reply(rng)}
        if rng.random() < 0.5:
            m["reasoning_content"] = paragraph(rng, rng.randint(1, 4))
        msgs.append(m)
    return {"messages": msgs, "tools": TOOLS} if tools else {"messages": msgs}


def runs(mask) -> list[list[int]]:
    out, start = [], None
    for i, v in enumerate(list(mask) + [0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append([start, i])
            start = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = random.Random(f"dfo-chat-lengths:{a.seed}")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        target = make_target(t / "target", None, None)
        recs = t / "chats.jsonl"
        recs.write_text("".join(json.dumps(chat(rng)) + "\n" for _ in range(a.records)))
        subprocess.run([sys.executable, "-m", "trainer.data", "tokenize", "--target", str(target),
                        "--in", str(recs), "--out", str(t / "store"), "--workers", "2"], check=True, cwd=REPO)
        from trainer.data.tokenized import TokenStore

        store = TokenStore(str(t / "store"))
        samples = []
        for i in range(store.n):
            m = store.mask(i)
            samples.append([int(m.shape[0]), runs(m)])
    lengths = sorted(n for n, _ in samples)
    q = {p: lengths[min(len(lengths) - 1, int(p / 100 * len(lengths)))] for p in (10, 50, 90, 99)}
    Path(a.out).write_text(json.dumps({
        "source": f"bench/chat_lengths.py --records {a.records} --seed {a.seed}: generated "
                  "multi-turn chats, Qwen3's tokenizer and hybrid template, masked by "
                  "trainer.data tokenize", "quantiles": q, "samples": samples},
        separators=(",", ":")))
    print(f"{len(samples)} samples; tokens p10 {q[10]} p50 {q[50]} p90 {q[90]} p99 {q[99]} "
          f"max {lengths[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
