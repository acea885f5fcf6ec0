"""Each injected fault really happens in a real trainer process (tiny CPU config)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

import pytest

pytest.importorskip("torch")

from tests.helpers.trainer import PY, REPO, make_synth, make_target, markers, run_trainer, \
    tiny_overrides  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=32), d


def _args(tiny, tmp_path, steps=4, **extra):
    target, data, _ = tiny
    kw = {"train.max_steps": steps, "train.micro_batch": 4, "checkpoint.save_final": "false"}
    kw.update(extra)
    return ["train", *tiny_overrides(target, data, str(tmp_path / "run"), **kw)]


def _steps(out: str) -> list[dict]:
    return [m for m in markers(out) if m["kind"] == "step"]


def test_exit_n_and_attempt_filter(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path), env={"DFO_FAULT": "exit=7@2"})
    assert r.returncode == 7, r.stderr[-2000:]
    assert [s["step"] for s in _steps(r.stdout)] == [1]
    assert "fault injection: exit at step 2" in r.stderr
    # `#1` is the default: a second attempt runs clean (the supervisor's retry succeeds)
    r2 = run_trainer(_args(tiny, tmp_path, steps=2), env={"DFO_FAULT": "exit=7@2",
                                                          "DFO_ATTEMPT": "2"})
    assert r2.returncode == 0, r2.stderr[-2000:]


def test_flag_overrides_env_and_bad_spec_is_config_error(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path, **{"fault.spec": "exit=300@2"}))
    assert r.returncode == 2
    assert "config: --fault.spec: 'exit=300@2': exit code must be an integer 0..255" in r.stderr
    assert "Traceback" not in r.stderr


def test_sigkill(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path), env={"DFO_FAULT": "sigkill@2"})
    assert r.returncode == -signal.SIGKILL
    assert [s["step"] for s in _steps(r.stdout)] == [1]


def test_oom_is_torch_out_of_memory_exit_5(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path), env={"DFO_FAULT": "oom@3"})
    assert r.returncode == 5
    assert "torch.OutOfMemoryError: CUDA out of memory." in r.stderr
    assert [s["step"] for s in _steps(r.stdout)] == [1, 2]


def test_nan_loss_ends_with_exit_5(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path), env={"DFO_FAULT": "nan@2"})
    assert r.returncode == 5, r.stderr[-2000:]
    assert "nan" in r.stderr.lower() and "step 2" in r.stderr


def _runnable_s(pid: int) -> float | None:
    """Seconds the process's main thread has been running or waiting for a CPU
    (/proc/PID/schedstat: on-CPU and run-queue time); None when the kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            on, queued = f.read().split()[:2]
        return (int(on) + int(queued)) / 1e9
    except (OSError, ValueError):
        return None


def _run_timed(args: list[str], env: dict) -> tuple[int, str, str, list[tuple[float, float | None]]]:
    """The trainer run like ``run_trainer``; at each step marker, as it is read: (monotonic
    time, the main thread's runnable seconds so far)."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **env)
    p = subprocess.Popen([PY, "-m", "trainer", *args], cwd=REPO, env=e, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    drain.start()
    out, at = [], []
    try:
        for ln in p.stdout:
            out.append(ln)
            if ln.startswith("@dfo ") and '"kind": "step"' in ln:
                at.append((time.monotonic(), _runnable_s(p.pid)))
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    drain.join(timeout=30)
    return p.returncode, "".join(out), "".join(err), at


def _stretch(at: list[tuple[float, float | None]], first: int, last: int) -> float:
    """Wall time per runnable second of the main thread from step marker ``first`` to
    ``last`` (1-based): about 1 for a step that works, 1/F for one the throttle stretches.
    A busy machine makes a step wait for a CPU, which is runnable time: the figure does not
    depend on the load. Without schedstat, the plain wall time of those steps."""
    (t0, r0), (t1, r1) = at[first - 1], at[last - 1]
    if r0 is None or r1 is None:
        return (t1 - t0) / (last - first)
    return (t1 - t0) / max(r1 - r0, 1e-9)


def test_slow_throttles_and_prints_flex_dense_warning(tiny, tmp_path):
    rc, out, err, at = _run_timed(_args(tiny, tmp_path, steps=8), {"DFO_FAULT": "slow=0.25@5"})
    assert rc == 0, err[-2000:]
    assert "materializes the full scores matrix" in err
    assert [s["step"] for s in _steps(out)] == list(range(1, 9)) and len(at) == 8
    before = _stretch(at, 1, 4)   # steps 2..4 (step 1 includes setup)
    after = _stretch(at, 6, 8)    # steps 7..8, fully throttled (F = 0.25: about 4)
    assert after > 2.0 * before, (before, after)


def _read_for(fd: int, seconds: float) -> str:
    """Everything the fd yields within ``seconds`` (raw reads: no text-buffer surprises)."""
    out, deadline = [], time.time() + seconds
    while (left := deadline - time.time()) > 0:
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            break
        b = os.read(fd, 65536)
        if not b:
            break
        out.append(b)
    return b"".join(out).decode("utf-8", "replace")


def _ignores(pid: int, *sigs: int) -> bool:
    """The process ignores all these signals (/proc/PID/status SigIgn)."""
    try:
        for ln in open(f"/proc/{pid}/status"):
            if ln.startswith("SigIgn:"):
                mask = int(ln.split()[1], 16)
                return all(mask & (1 << (s - 1)) for s in sigs)
    except OSError:
        pass
    return False


def test_hang_is_alive_silent_and_heartbeat_free(tiny, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", DFO_FAULT="hang@3")
    p = subprocess.Popen([PY, "-m", "trainer", *_args(tiny, tmp_path, **{"train.heartbeat_s": 1})],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fd = p.stdout.fileno()
    try:
        seen, deadline = "", time.time() + 120
        while '"kind": "step", "step": 2' not in seen and '"step": 2,' not in seen:
            assert time.time() < deadline, "no step 2 within 120 s"
            chunk = _read_for(fd, 1.0)
            assert chunk or p.poll() is None, "trainer exited before the hang"
            seen += chunk
        # the hang took hold (it ignores SIGTERM and SIGINT from then on, after it silenced
        # the output), however long a loaded machine took from step 2 to it
        while not _ignores(p.pid, signal.SIGTERM, signal.SIGINT):
            assert time.time() < deadline and p.poll() is None, "the hang never took hold"
            seen += _read_for(fd, 0.1)
        # Output already in flight when the hang took hold (a heartbeat from step 3's work
        # on a loaded machine) is fine; from then on there must be silence.
        early = _read_for(fd, 2.0)
        assert '"step": 3' not in seen + early, early
        late = _read_for(fd, 4.0)  # 4 heartbeat periods
        assert p.poll() is None, "the hung process must stay alive"
        assert "heartbeat" not in late and '"step": 3' not in late, late
        p.terminate()  # like a native deadlock: SIGTERM does not end it, SIGKILL does
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(1.0)
    finally:
        p.kill()
        p.wait(10)


def test_fx_race_real_torch_error_threads_gate_off(tiny, tmp_path):
    """The lazy-compile race's unguarded threads layout + fx_race: torch's own error, exit 5."""
    r = run_trainer(_args(tiny, tmp_path, **{"parallel.layout": "threads",
                                             "parallel.drafter_devices": "[cpu,cpu,cpu]",
                                             "compile.gate": "false"}),
                    env={"DFO_FAULT": "fx_race@2"})
    assert r.returncode == 5, r.stderr[-3000:]
    assert ("RuntimeError: Detected that you are using FX to symbolically trace a "
            "dynamo-optimized function. This is not supported at the moment.") in r.stderr
    assert "torch/_dynamo/eval_frame.py" in r.stderr  # raised by torch, not by us
    assert [s["step"] for s in _steps(r.stdout)] == [1]


def test_fx_race_with_dflash2_is_classified_as_with_dflash(tiny, tmp_path):
    """model.method dflash2 under the injected FX fault: the trainer exits as a DFlash run
    does (exit 5, torch's own error), and the supervisor's classifier reads the same class
    from the same evidence lines."""
    from orchestrator.common.classify import classify

    seen = {}
    for method in ("dflash", "dflash2"):
        extra = {"model.method": method, "compile.gate": "false"}
        if method == "dflash2":
            extra.update({"model.selector_rank": 8, "model.selector_top_k": 4,
                          "model.sliding_window": 24})
        r = run_trainer(_args(tiny, tmp_path / method, **extra), env={"DFO_FAULT": "fx_race@2"})
        assert r.returncode == 5, r.stderr[-3000:]
        assert [s["step"] for s in _steps(r.stdout)] == [1]
        d = classify(r.stdout.splitlines() + r.stderr.splitlines(), exit_code=r.returncode)
        seen[method] = (d.cls, [e.text for e in d.evidence])
    assert seen["dflash2"] == seen["dflash"]
    assert seen["dflash2"][0] == "fx_trace_race"
    assert seen["dflash2"][1][0].startswith("RuntimeError: Detected that you are using FX to "
                                            "symbolically trace a dynamo-optimized function")
