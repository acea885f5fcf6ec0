"""``regenerate``'s engines and wavefront on the CPU with the tiny target: the wavefront equals
each conversation rewritten alone; the openai engine against a real HTTP server on 127.0.0.1
(tests/helpers/chat_server.py, the target through transformers: a protocol stand-in for vLLM
or SGLang) equals the transformers engine on a fixed set; a real subprocess killed mid-run
with SIGKILL resumes to the file an uninterrupted run writes; errors are one line and a code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dfo_contract.exitcodes import CONFIG_ERROR
from tests.fixtures.chat.tokenizer import install
from tests.helpers.chat_server import serve_in_thread
from tests.helpers.regen_set import LIMIT, NEW, write_fixed
from tests.helpers.trainer import REPO, make_target
from trainer.data.cli import main as data_main
from trainer.data.engines import EngineSpec, Sampling
from trainer.data.meta import read_meta
from trainer.data.progress import Progress
from trainer.data.regenerate import Rewriter, open_conversation, regenerate
from trainer.data.records import conversation_from_record


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return install(make_target(str(tmp_path_factory.mktemp("t") / "target"), layers=2))


@pytest.fixture(scope="module")
def server(target):
    srv, url = serve_in_thread(target)
    yield srv, url
    srv.shutdown()


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    return write_fixed(tmp_path_factory.mktemp("set") / "in.jsonl")


def rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def run(target, src, out, **kw) -> tuple[tuple[int, int], Progress]:
    prog = Progress(None, "regenerate", every_s=3600)
    res = regenerate(target, src, str(out), max_new_tokens=NEW, device="cpu", max_model_len=LIMIT,
                     progress=prog, **kw)
    return res, prog


@pytest.fixture(scope="module")
def reference(tmp_path_factory, target, fixed):
    """The transformers engine's output on the fixed set, thinking on and off."""
    d = tmp_path_factory.mktemp("ref")
    out = {}
    for thinking in ("on", "off"):
        (n, _), prog = run(target, fixed, d / f"{thinking}.jsonl", batch_size=3, thinking=thinking)
        assert n == 7 and dict(prog.summary.dropped) == {
            "malformed JSON": 1, "missing messages": 1, "longer than the context": 1}, \
            prog.summary.lines()
        out[thinking] = (d / f"{thinking}.jsonl").read_text()
    assert out["on"] != out["off"]
    return out


def test_wavefront_equals_each_conversation_alone(target, fixed, reference):
    """Batched across conversations (3 open at once, refilled as they close), the output is
    what each conversation rewritten alone, turn after turn, gives; in index order."""
    got = [json.loads(x) for x in reference["on"].splitlines()]
    assert [r["index"] for r in got] == [0, 1, 2, 3, 6, 8, 9]
    rw = Rewriter(target, EngineSpec(device="cpu", batch_size=1), Sampling(NEW),
                  {"enable_thinking": True}, LIMIT)
    src = [json.loads(x) for i, x in enumerate(open(fixed)) if i in {0, 1, 2, 3, 6, 8, 9}]
    alone = rw.rewrite([conversation_from_record(r) for r in src])
    assert [r["messages"] for r in got] == alone
    # the tool-call turn is kept, the reply after the tool result rewritten
    tool = got[3]["messages"]
    assert tool[1]["tool_calls"] and tool[3]["content"] != "It is sunny." and got[3]["tools"]
    c = open_conversation(0, 1, conversation_from_record(src[3]))
    assert c.turns == [3]


def test_openai_engine_equals_transformers(tmp_path, target, fixed, reference, server):
    srv, url = server
    for thinking in ("on", "off"):
        out = tmp_path / f"{thinking}.jsonl"
        spec = EngineSpec("openai", url=url + "/v1", concurrency=3)
        (n, skipped), prog = run(target, fixed, out, batch_size=4, thinking=thinking, engine=spec)
        assert (n, skipped) == (7, 0)
        assert out.read_text() == reference[thinking]
        assert prog.tokens > 0
        m = read_meta(str(out))
        assert m.thinking == thinking and m.sampling == Sampling(NEW).record()
        assert m.engines == ({"name": "openai", "version": "standin-1",
                              "host": url.removeprefix("http://"), "model": "target"},)


def test_openai_key_is_sent_and_never_recorded(tmp_path, target, fixed, monkeypatch):
    srv, url = serve_in_thread(target, key="s3cret-key")
    try:
        out = tmp_path / "o.jsonl"
        rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(out),
                        "--thinking", "on", "--engine", "openai", "--url", url])
        assert rc == CONFIG_ERROR and (not out.exists() or out.stat().st_size == 0)
        monkeypatch.setenv("REGEN_KEY", "s3cret-key")
        rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(out),
                        "--thinking", "on", "--engine", "openai", "--url", url, "--api-key-env",
                        "REGEN_KEY", "--max-new-tokens", "2", "--max-model-len", str(LIMIT)])
        assert rc == 0 and len(rows(out)) == 7
        assert "s3cret" not in (tmp_path / "o.jsonl.meta.json").read_text()
    finally:
        srv.shutdown()


@pytest.mark.parametrize("argv,needle", [
    (["--engine", "openai", "--url", "http://127.0.0.1:9"], "cannot reach the server"),
    (["--engine", "openai"], "no --url"),
    (["--engine", "openai", "--url", "ftp://x"], "not an http(s) URL"),
    (["--engine", "openai", "--url", "http://127.0.0.1:9", "--api-key-env", "DFO_NO_SUCH_VAR"],
     "DFO_NO_SUCH_VAR: the variable is not set"),
    (["--url", "http://127.0.0.1:9"], "only for --engine openai"),
    (["--engine", "openai", "--url", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
    (["--temperature", "-1"], "--temperature"),
])
def test_bad_engine_arguments_are_one_line(tmp_path, target, fixed, capsys, argv, needle):
    out = tmp_path / "o.jsonl"
    rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(out),
                    "--thinking", "on", *argv])
    err = capsys.readouterr().err
    said = [x for x in err.splitlines() if x.startswith("trainer.data:")]
    assert rc == CONFIG_ERROR and len(said) == 1 and needle in said[0] and "Traceback" not in err, err
    assert not out.exists() or out.stat().st_size == 0


def test_wrong_model_name_is_a_config_error(tmp_path, target, fixed, server, capsys):
    rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(tmp_path / "o.jsonl"),
                    "--thinking", "on", "--engine", "openai", "--url", server[1], "--model", "nope"])
    assert rc == CONFIG_ERROR and "--model nope: not served" in capsys.readouterr().err


def test_vllm_engine_without_vllm_is_one_line(tmp_path, target, fixed, capsys):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(tmp_path / "o.jsonl"),
                    "--thinking", "on", "--engine", "vllm"])
    err = capsys.readouterr().err
    said = [x for x in err.splitlines() if x.startswith("trainer.data:")]
    assert rc == CONFIG_ERROR and len(said) == 1 and "Traceback" not in err
    assert said[0].startswith("trainer.data: --engine vllm: vllm is not installed")


def test_resume_with_other_sampling_is_refused(tmp_path, target, fixed, reference, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text(reference["on"].splitlines(keepends=True)[0])
    (tmp_path / "o.jsonl.meta.json").write_text(json.dumps(
        {"format": "dfo-regenerated", "version": 1, "thinking": "on", "target": target,
         "sampling": Sampling(NEW).record(), "engines": [{"name": "transformers"}]}))
    rc = data_main(["regenerate", "--target", target, "--in", fixed, "--out", str(out),
                    "--thinking", "on", "--temperature", "0.7", "--max-new-tokens", str(NEW)])
    err = capsys.readouterr().err
    assert rc == 3 and "was generated with --temperature 0.0" in err


def test_sigkill_mid_round_resumes_to_the_uninterrupted_file(tmp_path, target, reference, fixed):
    """A real ``python -m trainer.data regenerate --engine openai`` is killed while its
    requests are in flight (the server holds every request after the 6th), then resumed; the
    file equals the uninterrupted transformers run's, and the meta lists the engines."""
    srv, url = serve_in_thread(target)
    model = srv.model
    model.hold_after = 6
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "trainer.data", "regenerate", "--target", target, "--in", fixed,
           "--out", str(out), "--thinking", "on", "--max-new-tokens", str(NEW),
           "--max-model-len", str(LIMIT), "--batch-size", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd + ["--engine", "openai", "--url", url, "--concurrency", "2"], cwd=REPO,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while model.held < 1:
            assert p.poll() is None, p.stderr.read()
            assert time.monotonic() < deadline, "no request was ever held"
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        model.gate.set()
    try:
        assert p.returncode == -signal.SIGKILL
        first = out.read_text()
        assert 0 < first.count("\n") < 7 and reference["on"].startswith(first)
        with open(out, "a") as f:  # as if killed in the middle of a write
            f.write('{"index": 99, "messa')
        model.hold_after = None
        r = subprocess.run(cmd + ["--engine", "openai", "--url", url, "--concurrency", "2"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert out.read_text() == reference["on"]
        assert [e["name"] for e in read_meta(str(out)).engines] == ["openai"]
    finally:
        srv.shutdown()


#: the progress lines regenerate prints, as a ``step_pattern`` (docs/own-trainer.md)
STEP_PATTERN = r"regenerate: (?P<step>\d+)(?:/\d+)? \([\d.]+/s(?:, (?P<tok_s>[\d.]+) tok/s)?\)"


def test_progress_lines_read_as_steps():
    import io

    from orchestrator.common.own_trainer import compile_step_pattern, match_step

    buf = io.StringIO()
    p = Progress(10, "regenerate", stream=buf, every_s=0)
    p.update(0)
    p.update(3, tokens=120)
    pat = compile_step_pattern(STEP_PATTERN)
    got = [match_step(pat, x) for x in buf.getvalue().splitlines()]
    assert [g.step for g in got] == [0, 3] and got[0].tokens_per_s is None and got[1].tokens_per_s > 0
    # records a resume finds done count as done, not in the rate
    buf = io.StringIO()
    Progress(10, "regenerate", stream=buf, every_s=0).update(5, skipped=True)
    assert buf.getvalue() == "regenerate: 5/10 (0.0/s)\n"
    # the run file documented is this pattern
    assert f"step_pattern: '{STEP_PATTERN}'" in open(os.path.join(REPO, "docs", "own-trainer.md")).read()


@pytest.mark.slow
def test_a_supervised_regenerate_restarts_and_resumes(tmp_path, target, fixed, reference):
    """``dfo launch -- python -m trainer.data regenerate --engine openai ...`` on the local
    transport: the server fails every try of one request (the attempt exits 5 after its
    retries), the supervisor restarts it, the restart resumes, and the run ends done with the
    records done as its step and a file equal to the uninterrupted run's."""
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport
    from tests.supervisor_env import FAST, events, local_host, make_root, wait_final

    srv, url = serve_in_thread(target)
    srv.model.fail_from, srv.model.fail_count = 6, 4  # after 0-3 are written
    try:
        root = make_root(tmp_path)
        run_ops = RunOps(LocalTransport("local"), local_host(root))
        out = tmp_path / "regen.jsonl"
        rf = tmp_path / "regen.yaml"
        rf.write_text(f"cwd: {REPO}\nstep_pattern: '{STEP_PATTERN}'\nenv: {{OMP_NUM_THREADS: '1'}}\n")
        cmd = ["python", "-m", "trainer.data", "regenerate", "--target", target, "--in", fixed,
               "--out", str(out), "--thinking", "on", "--max-new-tokens", str(NEW),
               "--max-model-len", str(LIMIT), "--batch-size", "2", "--engine", "openai",
               "--url", url, "--concurrency", "1", "--progress-every", "0"]
        plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="regen",
                                            backoff_scale=0.01, thresholds=dict(FAST),
                                            env_check=False))
        info = wait_final(run_ops, plan.run_id, timeout=240)
    finally:
        srv.shutdown()
    assert info["status"] == "done", info.get("reason")
    assert [c.cls for c in events(root, plan.run_id) if c.kind == "classified"] == ["crash", "done"]
    assert srv.model.failed == 4 and info["last_step"] == 10 and info["tokens_per_s"]
    log1 = (root / "runs" / plan.run_id / "attempt-1.log").read_text()
    assert "trainer.data: --url: POST /v1/chat/completions" in log1 and "failed 4 times" in log1
    assert "(4 already done)" in (root / "runs" / plan.run_id / "attempt-2.log").read_text()
    assert out.read_text() == reference["on"]
