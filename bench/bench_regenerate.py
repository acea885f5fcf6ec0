"""How fast ``python -m trainer.data regenerate`` rewrites records, per engine, side by side.

    python bench/bench_regenerate.py --work DIR [--target DIR] [--records 48] [--turns 2]
        [--max-new-tokens 32] [--batch-size 16] [--concurrency 4] [--url URL ...]
        [--vllm-serve PYTHON] [--device cpu] [--json OUT]

The same records (``--records`` synthetic conversations of ``--turns`` user/assistant turns,
made once in ``--work``) and the same target, greedy, thinking on, in one run:

- ``transformers``: the reference engine in this process;
- ``openai`` against the stand-in server (tests/helpers/chat_server.py: the target through
  transformers in a process of its own, one request at a time: a protocol stand-in, not a
  serving engine; its rate says what the client and the protocol cost, not vLLM's);
- ``openai`` against each ``--url`` given (a user's vLLM or SGLang serving the same target);
- ``vllm`` in this process, when vllm is importable (else the row says it was not measured).

Without ``--target`` a tiny random Qwen3 (hidden 64, 2 layers, head_dim 64) with the tests'
Qwen3-like tokenizer is made in ``--work``. ``--vllm-serve PYTHON`` also starts a real ``vllm
serve`` of the target for its own row (and stops it after). Prints a table: the engine's
start-up seconds (model load, server check, vLLM's compile), the seconds to regenerate the
records after it, records/s, generated tokens/s, whether the output equals the transformers
engine's, and the projected wall time for 1.1M records at that rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASET = 1_100_000


def make_records(path: Path, n: int, turns: int) -> None:
    words = ["alpha", "beta", "gamma", "delta", "omega", "tea", "rain", "code", "map", "sun"]
    with open(path, "w") as f:
        for i in range(n):
            msgs = []
            for t in range(turns):
                q = " ".join(words[(i * 7 + t * 3 + k) % len(words)] for k in range(3 + (i + t) % 5))
                msgs += [{"role": "user", "content": f"{q}?"}, {"role": "assistant", "content": "x"}]
            f.write(json.dumps({"messages": msgs}) + "\n")


def run_engine(name: str, target: str, src: Path, out: Path, a, **engine_kw) -> dict:
    """Open the engine (timed apart: a model load, a server check, vLLM's start-up), then
    regenerate ``src`` with it."""
    from trainer.data.engines import EngineSpec, Sampling
    from trainer.data.progress import Progress
    from trainer.data.regenerate import Rewriter, regenerate

    for p in (out, Path(str(out) + ".meta.json")):
        if p.exists():
            p.unlink()
    spec = EngineSpec(name, device=a.device, batch_size=a.batch_size, **engine_kw)
    sampling = Sampling(a.max_new_tokens)
    t = time.perf_counter()
    rw = Rewriter(target, spec, sampling, {"enable_thinking": True}, None)
    start = time.perf_counter() - t
    prog = Progress(None, f"regenerate[{name}]", every_s=3600, stream=open(os.devnull, "w"))
    try:
        t = time.perf_counter()
        n, _ = regenerate(target, str(src), str(out), batch_size=a.batch_size, thinking="on",
                          engine=spec, sampling=sampling, progress=prog, rewriter=rw)
        wall = time.perf_counter() - t
    finally:
        rw.close()
    return {"records": n, "start_s": round(start, 2), "wall_s": round(wall, 2),
            "records_per_s": round(n / wall, 3), "tokens": prog.tokens,
            "tokens_per_s": round(prog.tokens / wall, 1), "engine": asdict(rw.engine.info)}


def start_standin(target: str, log: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "tests.helpers.chat_server", "--target", target],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    line = p.stdout.readline()
    if not line.startswith("listening "):
        p.kill()
        raise SystemExit(f"bench_regenerate: the stand-in server did not start: {log.read_text()[-2000:]}")
    return p, line.split()[1]


def start_vllm_serve(py: str, target: str, log: Path, max_model_len: int) -> tuple[subprocess.Popen, str]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([py, "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                          "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                          "--max-model-len", str(max_model_len)],
                         env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"), stdout=open(log, "w"),
                         stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"bench_regenerate: vllm serve exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return p, url
        except OSError:
            time.sleep(1)
    p.kill()
    raise SystemExit("bench_regenerate: vllm serve did not answer in 900 s")


def hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s < 86400 * 3 else f"{s / 86400:.1f} d"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--target", default=None)
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--url", action="append", default=[], help="an OpenAI-compatible server (repeatable)")
    ap.add_argument("--api-key-env", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vllm-serve", default=None, metavar="PYTHON",
                    help="also start `PYTHON -m vllm.entrypoints.openai.api_server` on the target "
                         "for its own row (a python with vllm), stopped after it")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    w = Path(a.work).resolve()
    w.mkdir(parents=True, exist_ok=True)
    target = a.target
    if target is None:
        from tests.fixtures.chat.tokenizer import install
        from trainer.model.target import make_tiny_target

        target = str(w / "target")
        if not (w / "target" / "config.json").exists():
            install(make_tiny_target(target, hidden=64, layers=2, heads=2, kv_heads=1, head_dim=64))
    src = w / f"records-{a.records}x{a.turns}.jsonl"
    make_records(src, a.records, a.turns)
    rows: dict[str, dict] = {}
    print(f"bench_regenerate: {a.records} records x {a.turns} turns, max_new_tokens {a.max_new_tokens}, "
          f"batch {a.batch_size}, concurrency {a.concurrency}, target {target}", flush=True)
    ref = w / "out-transformers.jsonl"
    rows["transformers"] = run_engine("transformers", target, src, ref, a)
    print("  transformers done", flush=True)
    srv, url = start_standin(target, w / "standin.log")
    try:
        rows["openai (stand-in)"] = run_engine("openai", target, src, w / "out-standin.jsonl", a,
                                               url=url, concurrency=a.concurrency)
        rows["openai (stand-in)"]["out"] = "out-standin.jsonl"
    finally:
        srv.terminate()
        srv.wait()
    print("  openai (stand-in) done", flush=True)
    for i, u in enumerate(a.url):
        name = f"openai ({u})"
        rows[name] = run_engine("openai", target, src, w / f"out-url{i}.jsonl", a, url=u,
                                concurrency=a.concurrency, api_key_env=a.api_key_env)
        rows[name]["out"] = f"out-url{i}.jsonl"
    if a.vllm_serve:
        vs, vurl = start_vllm_serve(a.vllm_serve, target, w / "vllm-serve.log", 4096)
        try:
            rows["openai (vllm serve)"] = run_engine("openai", target, src, w / "out-vllm-serve.jsonl", a,
                                                     url=vurl, concurrency=a.concurrency)
            rows["openai (vllm serve)"]["out"] = "out-vllm-serve.jsonl"
        finally:
            vs.terminate()
            vs.wait()
        print("  openai (vllm serve) done", flush=True)
    try:
        import vllm  # noqa: F401
        rows["vllm"] = run_engine("vllm", target, src, w / "out-vllm.jsonl", a)
        rows["vllm"]["out"] = "out-vllm.jsonl"
    except ImportError:
        rows["vllm"] = {"not_measured": "vllm is not installed in this env"}
    reference = ref.read_text()
    for r in rows.values():
        if "out" in r:
            r["equal_to_transformers"] = (w / r.pop("out")).read_text() == reference
    rows["transformers"]["equal_to_transformers"] = True
    print(f"\n| engine | start s | wall s | records/s | gen tok/s | equal | {DATASET:,} records |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "not_measured" in r:
            print(f"| {name} | not measured: {r['not_measured']} | | | | | |")
            continue
        proj = DATASET / r["records_per_s"] if r["records_per_s"] else float("inf")
        r["projected_1_1M_s"] = round(proj)
        print(f"| {name} | {r['start_s']} | {r['wall_s']} | {r['records_per_s']} | {r['tokens_per_s']} | "
              f"{'yes' if r['equal_to_transformers'] else 'no'} | {hours(proj)} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"records": a.records, "turns": a.turns,
                                            "max_new_tokens": a.max_new_tokens,
                                            "batch_size": a.batch_size, "concurrency": a.concurrency,
                                            "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
