"""Deterministic compile and warm-up failures: each its own class, evidence rule and ladder
step, named by `dfo diagnose` with a change to make (never "restart unchanged"), and a log
that ends in a traceback is never "no failure line"."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dfo_contract.own_ladder import LadderStep
from orchestrator.cli import main
from orchestrator.common.classify import classify, match_line
from orchestrator.common.classify_rules import PERMANENT_CLASSES
from orchestrator.common.fallback import DEFAULT_LADDERS, STEPS, TRANSIENT, next_config
from orchestrator.common.verdict import Ladders, choose

FIX = Path(__file__).parent / "fixtures" / "logs"


def fixture_lines(name: str) -> list[str]:
    return [ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("## ")]


def diagnose(capsys, *args) -> tuple[int, str]:
    rc = main(["diagnose", *args])
    return rc, capsys.readouterr().out


CASES = [
    # (fixture, class, the fallback step diagnose proposes, what it changes)
    ("triton_out_of_resources.log", "compile_resources", "flex_smaller_blocks",
     {"compile.flex_block": 64, "compile.flex_stages": 1}),
    ("compile_pool_broken.log", "compile_workers", "compile_threads_one",
     {"compile.threads": 1}),
]


@pytest.mark.parametrize("name, cls, step, changed", CASES)
def test_recorded_compile_failures_are_named_with_their_cure(capsys, name, cls, step, changed):
    d = classify(fixture_lines(name), exit_code=1)
    assert d.cls == cls and not d.permanent, d
    assert d.evidence and all(fixture_lines(name)[e.line - 1].startswith(e.text[:50])
                              for e in d.evidence)
    rc, out = diagnose(capsys, "--json", "--exit-code", "1", str(FIX / name))
    j = json.loads(out)
    assert rc == 0 and j["class"] == cls and j["unknown"] is None
    assert j["fallback"]["step"] == step and j["fallback"]["changed"] == changed
    rc, out = diagnose(capsys, "--exit-code", "1", str(FIX / name))
    assert out.startswith(f"{cls}:") and f"fallback: {step}" in out
    assert "restart" not in out and "without an exit status" not in out


def test_first_collective_timeout_at_warmup_is_compile_skew_not_a_flaky_link(capsys):
    lines = fixture_lines("nccl_first_collective.log")
    d = classify(lines)
    assert d.cls == "warmup_collective" and "still compiling" in d.reason
    # a later collective's timeout stays nccl_timeout
    assert classify(fixture_lines("nccl_watchdog.log")).cls == "nccl_timeout"
    base = {"parallel.layout": "ddp"}
    c = choose(Ladders.assumed(base), "warmup_collective", 0, {})
    assert c.step == "warmup_sync" and c.changed == {"parallel.warmup_sync_s": 1800}
    # a second one with the meeting on: nothing else to try, the run ends (no retry loop)
    again = choose(Ladders.assumed(base), "warmup_collective", c.position, c.overrides)
    assert again.exhausted


def test_a_first_collective_log_alone_is_taken_as_ddp_and_gets_the_meeting(capsys):
    rc, out = diagnose(capsys, "--exit-code", "1", str(FIX / "nccl_first_collective.log"))
    assert rc == 0 and out.startswith("warmup_collective:")
    assert "fallback: warmup_sync (parallel.warmup_sync_s=1800)" in out
    assert "parallel.layout=ddp (the log's collectives are ddp's)" in out


def test_first_collective_diagnose_proposes_the_warmup_meeting(capsys, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n')
    cfg = tmp_path / "ddp.yaml"
    cfg.write_text(f"data:\n  path: {data}\nparallel:\n  layout: ddp\n")
    rc, out = diagnose(capsys, "--json", "--config", str(cfg),
                       str(FIX / "nccl_first_collective.log"))
    j = json.loads(out)
    assert rc == 0 and j["class"] == "warmup_collective" and j["unknown"] is None
    assert j["fallback"]["step"] == "warmup_sync"


def test_newer_triton_wording_is_not_an_oom_but_a_real_oom_still_is():
    line = ("[rank0]:No valid triton configs. OutOfMemoryError: out of resource: "
            "triton_flex_attention_backward Required: 296960 Hardware limit:232448 "
            "Reducing block sizes or `num_stages` may help.. ")
    assert match_line(line).cls == "compile_resources"
    assert match_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
                      ).cls == "oom"
    # both in one log: the real OOM wins (halving the batch is what frees memory)
    assert classify([line, "torch.OutOfMemoryError: CUDA out of memory."], exit_code=1
                    ).cls == "oom"
    assert match_line(line).name == "autotune-out-of-resources"


def test_autotuning_that_skips_a_config_is_no_class_unless_the_compile_failed():
    skip = ("[rank0]:No valid triton configs. OutOfMemoryError: out of resource: "
            "triton_flex_attention_backward Required: 296960 Hardware limit:232448 "
            "Reducing block sizes or `num_stages` may help.. ")
    nan = '@dfo {"kind": "step", "step": 3, "loss": NaN}'
    assert classify([skip, "[rank0]:Ignoring this choice.", nan], exit_code=1).cls == "nan_loss"
    assert classify([skip], exit_code=1).cls == "crash"
    failed = ("torch._inductor.exc.InductorError: NoValidChoicesError: No choices to select, "
              "please consider adding ATEN into max_autotune_gemm_backends config")
    d = classify([skip, failed], exit_code=1)
    assert d.cls == "compile_resources" and d.evidence[0].text == skip


def test_torchs_own_wording_of_a_dead_compile_worker():
    # torch 2.13 torch/_inductor/async_compile.py AsyncCompile.wait
    assert match_line("RuntimeError: A compilation subprocess exited unexpectedly. This is "
                      "likely due to a crash. To facilitate debugging, you can re-run with "
                      "TORCHINDUCTOR_COMPILE_THREADS=1 to cause compilation to occur in the "
                      "main process.").cls == "compile_workers"


def test_deterministic_compile_classes_never_restart_unchanged():
    for cls in ("compile_resources", "compile_workers", "warmup_collective"):
        assert cls not in TRANSIENT and cls not in PERMANENT_CLASSES
        assert DEFAULT_LADDERS[cls], cls


def test_flex_blocks_shrink_then_sdpa_then_the_run_ends():
    base = {"model.attention": "flex", "compile.flex_block": 0, "compile.flex_stages": 0}
    ladder, pos, ov, seen = DEFAULT_LADDERS["compile_resources"], 0, {}, []
    while True:
        c = next_config("compile_resources", ladder, pos, base, ov)
        if c.exhausted:
            break
        seen.append((c.step, dict(c.changed)))
        pos, ov = c.position, c.overrides
    assert seen == [
        ("flex_smaller_blocks", {"compile.flex_block": 64, "compile.flex_stages": 1}),
        ("flex_smaller_blocks", {"compile.flex_block": 32}),
        ("flex_smaller_blocks", {"compile.flex_block": 16}),
        ("attention_sdpa", {"model.attention": "sdpa"})]
    assert STEPS["flex_smaller_blocks"]({"model.attention": "sdpa"}, {}) is None


def test_compile_threads_and_warmup_sync_steps():
    assert STEPS["compile_threads_one"]({}, {"a": 1}) == {"a": 1, "compile.threads": 1}
    assert STEPS["compile_threads_one"]({"compile.threads": 1}, {}) is None
    assert STEPS["warmup_sync"]({"parallel.layout": "single"}, {}) is None
    assert STEPS["warmup_sync"]({"parallel.layout": "ddp"}, {}) == {
        "parallel.warmup_sync_s": 1800}


def test_an_own_command_gets_one_compile_thread_through_its_env():
    c = choose(Ladders(own=True), "compile_workers", 0, {})
    assert c.changed == {"env.TORCHINDUCTOR_COMPILE_THREADS": "1"} and not c.exhausted
    # its own ladder for the class wins
    own = Ladders(own=True, own_steps={"compile_workers": (LadderStep(env={"X": "1"}),)})
    assert choose(own, "compile_workers", 0, {}).changed == {"env.X": "1"}


def test_the_bundled_attempt_runs_with_one_compile_thread_once_the_step_applied(tmp_path):
    from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec
    from dfo_contract.runstate import RunState
    from orchestrator.supervisor.role import SoloRole
    from orchestrator.supervisor.source import BundledSource

    root = str(tmp_path)
    spec = RunSpec(identity=Identity(run_id="r", run_name="r", host="local", root=root,
                                     python=sys.executable, lock=f"{root}/run.lock"),
                   config=Config(path=f"{root}/c.yaml", base={"parallel.layout": "single"}),
                   resume=Resume(checkpoint_dir=root))
    src = BundledSource(spec, Bundled(), root, emit=lambda e: e)
    state = RunState.new("r", "r", now=0.0)
    env = src.launch(1, state, SoloRole()).env
    assert env.get("TORCHINDUCTOR_COMPILE_THREADS") == \
        __import__("os").environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    state.overrides = STEPS["compile_threads_one"](spec.config.merged({}), {})
    launch = src.launch(2, state, SoloRole())
    assert launch.env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert any(a.startswith("--compile.threads") for a in launch.argv)


# --- a log that ends in a traceback -------------------------------------------------------

@pytest.mark.parametrize("source, exc", [
    ("raise ValueError('lr must be positive, got -1')", "ValueError: lr must be positive"),
    ("def f(:\n  pass", "SyntaxError:"),
])
def test_a_real_traceback_is_a_crash_the_log_can_tell(capsys, tmp_path, source, exc):
    script = tmp_path / "train.py"
    script.write_text(source + "\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert p.returncode == 1 and exc.split(":")[0] in p.stderr
    log = tmp_path / "attempt-1.log"
    log.write_text(p.stdout + p.stderr)
    for args in ([], ["--exit-code", "1"]):
        rc, out = diagnose(capsys, "--json", *args, str(log))
        j = json.loads(out)
        assert rc == 0 and j["class"] == "crash" and j["unknown"] is None, j
        assert exc in j["reason"] and j["alternatives"] == {}
        assert any(exc in e["text"] for e in j["evidence"])
        rc, out = diagnose(capsys, *args, str(log))
        assert "without an exit status or a failure line" not in out
        assert "cannot know" not in out


def test_a_silent_log_still_says_what_it_cannot_know(capsys, tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_text('@dfo {"kind": "phase", "phase": "warmup"}\ncompiling ...\n')
    rc, out = diagnose(capsys, "--json", str(log))
    assert json.loads(out)["unknown"].startswith("the log ends without an exit status")


def test_a_traceback_followed_by_more_training_is_not_the_end(tmp_path):
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "KeyError: 'x'"] + [f"step {i} loss 1.0" for i in range(10)]
    d = classify(lines)
    assert d.cls == "crash" and d.reason == "the log shows no known failure pattern"


# --- the trainer honours the steps ----------------------------------------------------------

def test_flex_kernel_options_address_forward_and_backward():
    from trainer.compile.registry import flex_kernel_options

    assert flex_kernel_options(0, 0) is None
    assert flex_kernel_options(32, 1) == {
        "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32, "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 32,
        "bwd_BLOCK_M2": 32, "bwd_BLOCK_N2": 32, "fwd_num_stages": 1, "bwd_num_stages": 1}


def test_the_config_keys_are_validated():
    from dfo_contract.trainer_config import TrainerConfig
    from dfo_contract.trainer_config.parse import validate

    cfg = TrainerConfig()
    cfg.data.path = "d.jsonl"
    cfg.compile.flex_block = 48
    with pytest.raises(Exception, match="compile.flex_block"):
        validate(cfg)
    cfg.compile.flex_block, cfg.compile.threads = 32, -1
    with pytest.raises(Exception, match="compile.threads"):
        validate(cfg)


@pytest.mark.timeout(600)
def test_compiled_flex_runs_with_the_fallbacks_kernel_options_on_cpu(tmp_path):
    """Real torch.compile of flex attention on CPU with compile.flex_block/flex_stages and
    compile.threads applied as the trainer applies them: torch accepts the options, the
    result equals eager attention, and inductor compiles in one thread."""
    code = textwrap.dedent("""
        import json, torch
        import torch._inductor.config as icfg
        from torch.nn.attention.flex_attention import create_block_mask
        from dfo_contract.trainer_config import TrainerConfig
        from trainer.compile.registry import CompileRegistry
        registry = CompileRegistry()
        cfg = TrainerConfig()
        cfg.compile.flex_block, cfg.compile.flex_stages, cfg.compile.threads = 32, 1, 1
        registry.configure_kernels(cfg)
        q = torch.randn(1, 2, 128, 16)
        m = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, 128, 128, device="cpu")
        out = registry.flex_attention(q, q, q, m)
        ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        print(json.dumps({"close": bool(torch.allclose(out, ref, atol=1e-4)),
                          "threads": icfg.compile_threads,
                          "opts": registry.flex_kernel_options}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ,
                            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
                       cwd=str(Path(__file__).parent.parent), timeout=580)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["close"] and got["threads"] == 1
    assert got["opts"]["fwd_BLOCK_M"] == 32 and got["opts"]["bwd_num_stages"] == 1


def test_ddp_ranks_meet_after_warmup_before_the_first_collective(tmp_path):
    """Two real ranks under torchrun (gloo, CPU) with parallel.warmup_sync_s: the meeting
    runs after the warm-up and the run trains to the end."""
    import os

    from tests.helpers.trainer import PY, REPO, make_synth, make_target, markers, \
        tiny_overrides

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "data.jsonl"), num=16)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env.pop("DFO_FAULT", None)
    args = tiny_overrides(target, data, str(tmp_path / "run"), **{
        "train.max_steps": 2, "train.micro_batch": 4, "checkpoint.every": 0,
        "parallel.layout": "ddp", "parallel.warmup_sync_s": 120})
    p = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
         "-m", "trainer", "train", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "warmed up; meeting the other ranks (timeout 120 s)" in out
    assert sum(1 for m in markers(p.stdout) if m["kind"] == "done") == 1


# A real broken compile pool on CPU: inductor's own process pool (AsyncCompile.process_pool,
# the SubprocPool sidecar that compiles triton kernels) with its worker killed while a
# compile future waits, collected the way inductor collects kernels (AsyncCompile.wait).
# On CPU inductor compiles C++ kernels in threads, so the pool is driven directly.
BROKEN_POOL = textwrap.dedent("""
    import os, signal, time
    import torch._inductor.config as icfg
    icfg.compile_threads = 2
    from torch._inductor.async_compile import AsyncCompile

    def kids(pid):
        try:
            return [int(k) for k in open(f"/proc/{pid}/task/{pid}/children").read().split()]
        except OSError:
            return []

    fut = AsyncCompile.process_pool().submit(time.sleep, 60)
    workers, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline and not workers:
        workers = [w for s in kids(os.getpid()) for w in kids(s)]
        time.sleep(0.05)
    assert workers, "no compile worker started"
    for w in workers:
        os.kill(w, signal.SIGKILL)
    AsyncCompile().wait({"triton_tem_fused_0": fut})
""")


@pytest.mark.timeout(300)
def test_a_real_broken_compile_pool_is_compile_workers(capsys, tmp_path):
    p = subprocess.run([sys.executable, "-c", BROKEN_POOL], capture_output=True, text=True,
                       timeout=280, env={**__import__("os").environ,
                                         "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    assert p.returncode == 1, p.stderr[-2000:]
    log = tmp_path / "attempt-1.log"
    log.write_text(p.stdout + p.stderr)
    rc, out = diagnose(capsys, "--json", "--exit-code", "1", str(log))
    j = json.loads(out)
    assert j["class"] == "compile_workers" and j["unknown"] is None
    assert j["fallback"]["step"] == "compile_threads_one"
    texts = [e["text"] for e in j["evidence"]]
    assert any(t.startswith("concurrent.futures.process.BrokenProcessPool") for t in texts)
    assert any("A compilation subprocess exited unexpectedly" in t for t in texts)
