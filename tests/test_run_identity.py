"""Run identity and launch: distinct run ids and run directories, a supervisor
that never writes into a run it does not own, the loser of two simultaneous launches exits
9, a launch cut off by a dropped connection says how to check, and ``--resume latest``
names the torn checkpoints it skips (logs: tests/test_logs_never_started.py).

Real parts: the local transport, real supervisors and trainers on CPU, real follower
processes; pure logic also gets unit tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dfo_contract.checkpoints import REQUIRED_FILES, write_manifest
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.common.errors import ConnectError, LockHeldError
from dfo_contract.checkpoints import CkptInfo
from dfo_contract.runspec import Config, Identity, Resume, RunSpec
from orchestrator.plan import launch_facts as li
from orchestrator.plan import launch_plan as lp
from orchestrator.plan import run_identity as ri
from orchestrator.plan.launch_steps import STEPS_MODULE
from orchestrator.supervisor import runfiles
from orchestrator.transport import open_transport
from tests.supervisor_env import (FAST, REPO, dfo, events, hosts_yaml, local_host,  # noqa: F401
                                  make_root, wait_for, write_config)

CLI = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"


def fast_flags():
    out = ["--no-env-check", "--backoff-scale", "0.01"]
    for k, v in FAST.items():
        out += ["--threshold", f"{k}={v}"]
    return out


def dfo_proc(hosts, *args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", CLI, "--hosts", str(hosts), *args],
                          capture_output=True, text=True, cwd=str(REPO), env=env,
                          timeout=timeout)


def state(root, run_id):
    return json.loads((root / "runs" / run_id / "state.json").read_text())


@pytest.fixture
def env(tmp_path):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    return root, hosts, tmp_path


# --- pure ------------------------------------------------------------------------------------

def test_run_ids_of_one_second_differ():
    now = 1_764_000_000.0
    ids = {ri.make_run_id("mine", now) for _ in range(50)}
    assert len(ids) == 50
    a = ri.make_run_id("mine", now, suffix="0a1b2c")
    assert a == "mine-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-0a1b2c"
    with pytest.raises(ValueError):
        ri.make_run_id("mine", now, suffix="x; rm")


def test_run_dir_is_created_exclusively():
    parents, mine = ri.run_dir_argvs("/r/runs/a-1", "/r/locks", "/r/checkpoints/a")
    assert parents == ["mkdir", "-p", "--", "/r/runs", "/r/locks", "/r/checkpoints/a"]
    assert mine == ["mkdir", "--", "/r/runs/a-1"]   # no -p: fails when it exists
    # your own trainer's checkpoints inside its run dir: made after the exclusive mkdir
    # (made before it, the exclusive mkdir of a fresh run failed: seen on the H200)
    argvs = ri.run_dir_argvs("/r/runs/b-1", "/r/locks", "/r/runs/b-1", "/r/runs/b-1/ck")
    assert argvs == [["mkdir", "-p", "--", "/r/runs", "/r/locks"], ["mkdir", "--", "/r/runs/b-1"],
                     ["mkdir", "-p", "--", "/r/runs/b-1/ck"]]


def test_skipped_by_latest_names_torn_newer_ones():
    ck = [CkptInfo("step_4", 4, "/c/step_4", True),
          CkptInfo("step_2", 2, "/c/step_2", False, "rng.pt missing"),
          CkptInfo("step_8", 8, "/c/step_8", False, "manifest.json missing"),
          CkptInfo("step_6", 6, "/c/step_6", True)]
    assert [c.name for c in li.skipped_by_latest(ck)] == ["step_8"]
    assert "step_8" in li.skipped_warning(li.skipped_by_latest(ck)[0])
    assert "manifest.json missing" in li.skipped_warning(li.skipped_by_latest(ck)[0])
    assert [c.name for c in li.skipped_by_latest(ck[1:3])] == ["step_2", "step_8"]


def test_run_ownership_is_exclusive(tmp_path):
    fd = runfiles.own_run(str(tmp_path))
    try:
        with pytest.raises(runfiles.NotOwner, match="owned by another live supervisor"):
            runfiles.own_run(str(tmp_path))
    finally:
        os.close(fd)
    os.close(runfiles.own_run(str(tmp_path)))   # the owner is gone: taken over


# --- a supervisor never writes into a run it does not own -----------------------------------

def test_second_supervisor_on_a_live_run_writes_nothing(tmp_path):
    """A live run (its owner and run.lock held here): another supervisor started on the same
    directory exits at once and leaves state.json and events.jsonl as they were."""
    root = make_root(tmp_path)
    rd = root / "runs" / "live-1"
    rd.mkdir(parents=True)
    lock = root / "locks" / "run.lock"
    lock.parent.mkdir()
    spec = RunSpec(identity=Identity(run_id="live-1", run_name="live", host="local",
                                     root=str(root), python=sys.executable, lock=str(lock)),
                   config=Config(path=str(rd / "config.yaml")),
                   resume=Resume(checkpoint_dir=str(root / "checkpoints" / "live")))
    (rd / "spec.json").write_text(json.dumps(spec.to_json()))
    (rd / "state.json").write_text(json.dumps({"run_id": "live-1", "run_name": "live",
                                               "status": "running", "pid": os.getpid(),
                                               "attempt": 1}))
    (rd / "events.jsonl").write_text('{"kind": "supervisor_start", "mode": "setsid", '
                                     '"pid": 1, "resumed": false, "t": 1}\n')
    owner = runfiles.own_run(str(rd))
    before = {p.name: p.read_bytes() for p in rd.iterdir()}
    import fcntl

    lfd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lfd, fcntl.LOCK_EX)
    os.write(lfd, b"live-1\n")
    try:
        p = subprocess.run([sys.executable, "-m", "orchestrator.supervisor", "--run-dir", str(rd)],
                           capture_output=True, text=True, timeout=120, cwd=str(REPO),
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    finally:
        os.close(lfd)
        os.close(owner)
    assert p.returncode == 0
    assert "owned by another live supervisor" in p.stderr
    after = {p.name: p.read_bytes() for p in rd.iterdir()}
    assert after == before


# --- two launches at the same moment -----------------------------------------------------------

@pytest.mark.slow
def test_simultaneous_launches_get_their_own_runs(env, tiny_assets):  # noqa: F811
    """Two launches of one run name, both past the run.lock probe and in the same second
    (a barrier in their clocks): distinct run ids and directories, the winner's run is
    untouched, the loser fails with LockHeldError (exit 9)."""
    root, hosts, tmp = env
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 2000})
    host = local_host(root)
    barrier = threading.Barrier(2, timeout=120)
    same_second = 1_764_000_000.0
    results: dict[int, object] = {}

    def clock():
        barrier.wait()
        return same_second

    def one(i):
        run_ops = RunOps(open_transport(host), host, clock=clock)
        try:
            results[i] = run_ops.launch(LaunchOptions(
                config=str(cfg), run_name="twin", backoff_scale=0.01, thresholds=FAST,
                env_check=False, start_timeout=180))
        except Exception as e:  # noqa: BLE001 - inspected below
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(400)
    won = [r for r in results.values() if isinstance(r, lp.LaunchPlan)]
    lost = [r for r in results.values() if not isinstance(r, lp.LaunchPlan)]
    run_ops = RunOps(open_transport(host), host)
    try:
        assert len(won) == 1 and len(lost) == 1, results
        assert isinstance(lost[0], LockHeldError) and lost[0].exit_code == 9, lost[0]
        winner = won[0].run_id
        assert f"run {winner} is live" in str(lost[0])
        dirs = sorted(p.name for p in (root / "runs").iterdir())
        assert len(dirs) == 2 and winner in dirs
        # the winner's run goes on, and nothing of the loser was written into it
        wait_for(lambda: (state(root, winner).get("last_step") or 0) >= 1, 180, "training")
        st = state(root, winner)
        assert st["status"] == "running" and st["run_id"] == winner
        assert not [e for e in events(root, winner) if e.kind == "final"]
        starts = [e for e in events(root, winner) if e.kind == "supervisor_start"]
        assert len(starts) == 1
    finally:
        for r in won:
            run_ops.stop(r.run_id, timeout=120)


@pytest.mark.slow
def test_two_cli_launches_of_one_run_name(env, tiny_assets):  # noqa: F811
    """Two real `dfo launch` processes with the same --run-name at once: one runs, the other
    exits 9 (either at the probe or having lost the race for run.lock), never 10."""
    root, hosts, tmp = env
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 2000})
    penv = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-c", CLI, "--hosts", str(hosts), "launch", "--config", str(cfg),
            "--run-name", "same", "--json", *fast_flags()]
    ps = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=str(REPO), env=penv) for _ in range(2)]
    outs = [p.communicate(timeout=400) for p in ps]
    rcs = [p.returncode for p in ps]
    winners = [json.loads(o)["run_id"] for (o, _), rc in zip(outs, rcs, strict=True) if rc == 0]
    try:
        assert sorted(rcs) == [0, 9], outs
        loser_err = next(e for (_, e), rc in zip(outs, rcs, strict=True) if rc == 9)
        assert f"run {winners[0]} is live" in loser_err and loser_err.count("\n") == 1
        assert not [e for e in events(root, winners[0]) if e.kind == "final"]
    finally:
        for w in winners:
            dfo_proc(hosts, "stop", "--run", w)


# --- a launch cut off by a dropped connection --------------------------------------------------

class _DropsAfterStart:
    """The local transport, but the connection "drops" right after the command that starts
    the supervisor (launch's write-and-start steps) was sent: the run is going; the launch
    never hears back."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, argv, **kw):
        res = self.inner.run(argv, **kw)
        if list(argv[1:3]) == ["-m", STEPS_MODULE] and b'"start"' in (kw.get("stdin") or b""):
            raise ConnectError("connection to local failed: EOF",
                               hint="check the host and run the command again")
        return res


@pytest.mark.slow
def test_cut_off_launch_names_the_run_and_how_to_check(env, tiny_assets):  # noqa: F811
    root, hosts, tmp = env
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 2000})
    host = local_host(root)
    run_ops = RunOps(_DropsAfterStart(open_transport(host)), host)
    with pytest.raises(ConnectError) as ei:
        run_ops.launch(LaunchOptions(config=str(cfg), run_name="cut", backoff_scale=0.01,
                                 thresholds=FAST, env_check=False))
    run_id = next(p.name for p in (root / "runs").iterdir())
    msg = str(ei.value)
    try:
        assert ei.value.exit_code == 3 and "\n" not in msg
        assert f"dfo status --run {run_id}" in msg and f"dfo logs --run {run_id}" in msg
        assert "may already be going" in msg
        # ... and it is
        real = RunOps(open_transport(host), host)
        wait_for(lambda: any(r.live for r in real.status(run_id)), 120, "the run to start")
    finally:
        RunOps(open_transport(host), host).stop(run_id, timeout=120)


def test_cut_off_before_a_run_exists_says_how_to_check(env, tiny_assets):  # noqa: F811
    root, hosts, tmp = env
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    host = local_host(root)

    class Down(_DropsAfterStart):
        def run(self, argv, **kw):
            raise ConnectError("connection to local failed: EOF",
                               hint="check the host and run the command again")

    with pytest.raises(ConnectError) as ei:
        RunOps(Down(open_transport(host)), host).launch(
            LaunchOptions(config=str(cfg), run_name="x", env_check=False))
    assert "before a run was started" in str(ei.value) and "dfo status" in str(ei.value)


# --- --resume latest names each torn checkpoint it skips -------------------------------------

def _checkpoint(d: Path, step: int, *, torn: bool = False) -> None:
    p = d / f"step_{step}"
    p.mkdir(parents=True)
    for name in REQUIRED_FILES:
        (p / name).write_bytes(f"{name} {step}".encode())
    if torn:
        (p / "optim.pt").unlink()
        return
    write_manifest(str(p), step, list(REQUIRED_FILES))


def test_resume_latest_warns_naming_each_skipped_torn_checkpoint(env, capsys,
                                                                 tiny_assets):  # noqa: F811
    root, hosts, tmp = env
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    ck = root / "checkpoints" / "mine"
    _checkpoint(ck, 4)
    _checkpoint(ck, 8, torn=True)
    _checkpoint(ck, 12, torn=True)
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "mine",
                       "--resume", "latest", "--dry-run", "--no-env-check", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["resume"].endswith("/step_4")
    skipped = [w for w in d["warnings"] if "skipping checkpoint" in w]
    assert len(skipped) == 2
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "mine",
                       "--resume", "latest", "--dry-run", "--no-env-check")
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if "skipping checkpoint" in ln]
    assert len(lines) == 2 and all(ln.startswith("warning:") for ln in lines)
    assert "step_8 " in lines[0] and "step_12 " in lines[1] and "manifest" in lines[0]
