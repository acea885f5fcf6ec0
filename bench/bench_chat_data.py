"""Chat data throughput: ``trainer.data tokenize`` over all cores and ``regenerate`` on the GPU.

    python3 bench/bench_chat_data.py [--records 20000] [--regen 256] [--device auto] [--out DIR]

Builds a tiny random Qwen3 target with the Qwen3-like test tokenizer (tests/fixtures/chat),
writes synthetic multi-turn chats (reasoning, tool calls, ShareGPT rows), then measures:
tokenize records/s with 1 worker and with all cores (and checks both stores are identical);
regenerate samples/s (batched greedy, bf16 on CUDA), a second run that must skip everything
(resume), and that the regenerated file trains into a store. No network, no downloads.
Writes ``bench_chat_data.json`` to ``--out`` (default ``$OUT`` or ``bench/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records(n: int):
    for i in range(n):
        if i % 5 == 4:
            yield {"conversations": [{"from": "human", "value": f"list {i}"},
                                     {"from": "gpt", "value": " ".join(str(i + k) for k in range(40))}]}
            continue
        msgs = [{"role": "system", "content": "You count."}]
        for t in range(1 + i % 3):
            msgs.append({"role": "user", "content": f"count from {i + t} please " * 3})
            msgs.append({"role": "assistant", "content": " ".join(str(i + t + k) for k in range(60)),
                         "reasoning_content": f"start at {i + t}"})
        if i % 7 == 0:
            msgs.append({"role": "user", "content": "weather?"})
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]})
            msgs.append({"role": "tool", "content": "sunny"})
            msgs.append({"role": "assistant", "content": "It is sunny."})
        yield {"messages": msgs}


def run(cmd, **kw):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "trainer.data", *cmd], cwd=REPO, capture_output=True,
                       text=True, **kw)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:1])} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r, dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--regen", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    a = ap.parse_args()
    from tests.fixtures.chat.tokenizer import install
    from trainer.model.target import make_tiny_target

    res: dict = {"cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        target = install(make_tiny_target(os.path.join(tmp, "target"), hidden=256, layers=4,
                                          heads=8, kv_heads=4, head_dim=32, intermediate=512))
        src = os.path.join(tmp, "chat.jsonl")
        with open(src, "w") as f:
            for r in records(a.records):
                f.write(json.dumps(r) + "\n")
        r1, t1 = run(["tokenize", "--target", target, "--in", src, "--out", os.path.join(tmp, "s1"),
                      "--workers", "1"])
        rn, tn = run(["tokenize", "--target", target, "--in", src, "--out", os.path.join(tmp, "sn")])
        m1 = json.load(open(os.path.join(tmp, "s1", "manifest.json")))
        mn = json.load(open(os.path.join(tmp, "sn", "manifest.json")))
        res["tokenize"] = {"records": a.records, "s_1_worker": round(t1, 2), "s_all_cores": round(tn, 2),
                           "records_per_s_all_cores": round(a.records / tn, 1),
                           "identical": m1["files"] == mn["files"], "summary": rn.stdout.splitlines()}
        small = os.path.join(tmp, "small.jsonl")
        with open(small, "w") as f:
            for r in records(a.regen):
                f.write(json.dumps(r) + "\n")
        out = os.path.join(tmp, "regen.jsonl")
        rg, tg = run(["regenerate", "--target", target, "--in", small, "--out", out, "--batch-size", "64",
                      "--max-new-tokens", "64", "--device", a.device])
        rr, tr = run(["regenerate", "--target", target, "--in", small, "--out", out, "--device", a.device])
        rt, _ = run(["tokenize", "--target", target, "--in", out, "--out", os.path.join(tmp, "sr")])
        res["regenerate"] = {"samples": a.regen, "s": round(tg, 2), "stdout": rg.stdout.strip(),
                             "resume_stdout": rr.stdout.strip(), "resume_s": round(tr, 2),
                             "tokenize_regenerated": rt.stdout.splitlines()[:3]}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_chat_data.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("BENCH " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
