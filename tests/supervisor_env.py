"""Helpers for the supervisor/launch tests: a run config for the tiny real target + data
(the ``tiny_assets`` fixture of tests/conftest.py, made once per run), and a host root whose
``envs/current`` is this interpreter's venv (the "deployed env" of the local transport).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml

from dfo_contract import events as ev

VENV = os.path.dirname(os.path.dirname(sys.executable))
REPO = Path(__file__).resolve().parents[1]


def write_config(path: Path, assets: Path, **train) -> Path:
    cfg = yaml.safe_load((REPO / "orchestrator" / "config" / "defaults" / "tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"] = str(assets / "target")
    cfg["data"]["path"] = str(assets / "synth.jsonl")
    cfg["train"].update({"max_steps": 12, "log_every": 1, "heartbeat_s": 1.0})
    cfg["train"].update(train.pop("train", {}))
    cfg["checkpoint"].update({"every": 4, "keep": 5})
    cfg["checkpoint"].update(train.pop("checkpoint", {}))
    cfg.pop("run", None)
    path.write_text(yaml.safe_dump(cfg))
    return path


def make_root(base: Path) -> Path:
    root = base / "root"
    (root / "envs").mkdir(parents=True)
    os.symlink(VENV, root / "envs" / "current")
    return root


def local_host(root: Path, name: str = "local"):
    from orchestrator.config.inventory import HostConfig

    return HostConfig(name=name, transport="local", root=str(root), source="test")


def local_run_ops(base: Path):
    """(host root under ``base``, the local transport's RunOps on it, ``base``)."""
    from orchestrator.engine.runs import RunOps
    from orchestrator.transport.local import LocalTransport

    root = make_root(base)
    return root, RunOps(LocalTransport("local"), local_host(root)), base


def launch(run_ops, cfg, *, fault=None, name="t", **kw):
    """Launch the bundled trainer on ``cfg`` with the FAST thresholds (``thresholds=``
    adds to them) and a fast backoff, without the env check."""
    from orchestrator.engine.runs import LaunchOptions

    o = LaunchOptions(config=str(cfg), run_name=name, fault=fault, backoff_scale=0.01,
                      thresholds=dict(FAST, **kw.pop("thresholds", {})), env_check=False, **kw)
    return run_ops.launch(o)


def kinds(evs, kind: str) -> list:
    """The events of one kind."""
    return [e for e in evs if e.kind == kind]


def hosts_yaml(path: Path, root: Path) -> Path:
    path.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n    root: {root}\n")
    return path


class LocalSite(NamedTuple):
    """A host root on this machine (its env is this venv), the hosts.yaml whose default
    host ``local`` is it, and the test's directory (``local_site`` fixture)."""

    root: Path
    hosts: Path
    dir: Path


def local_site(base: Path) -> LocalSite:
    root = make_root(base)
    return LocalSite(root, hosts_yaml(base / "hosts.yaml", root), base)


#: thresholds for runs in tests: what only bounds a wait is generous (a loaded 2-core box
#: may stall a healthy step or an import for tens of seconds; a test that means a hang sets
#: its own ``train_s``/``hang_s``); ``kill_grace_s`` stays short, it is how soon a trainer
#: that ignores SIGTERM (a frozen peer's) is killed; a fast poll and backoff keep tests short
FAST = {"warmup_s": 300, "train_s": 60, "live_grace_s": 5, "kill_grace_s": 3,
        "stop_timeout_s": 120, "poll_s": 0.1}


def wait_final(run_ops, run_id: str, timeout: float = 240) -> dict:
    """The ended run as ``dfo status --json`` shows it (``RunStatus.to_json``)."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        runs = run_ops.status(run_id)
        info = runs[0] if runs else None
        if info is not None and info.state.final:
            return info.to_json()
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not end within {timeout}s: "
                         f"{info and info.state.status} {info and info.state.last_event}")


def wait_for(pred, timeout: float = 120, what: str = "condition", poll: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def events(root: Path, run_id: str) -> list[ev.Event]:
    """The run's events.jsonl, decoded (a record the contract refuses fails the test)."""
    return ev.read_events((root / "runs" / run_id / "events.jsonl").read_text())


def supervisor_stand_in(run_dir) -> subprocess.Popen:
    """A process that every liveness check takes for the live supervisor of ``run_dir``: its
    command line is ``-m orchestrator.supervisor --run-dir DIR`` (what
    ``dfo_contract.procs.supervisor_alive`` looks for); it only sleeps. For a run that must
    look live to its readers; the caller kills it."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                             "-m", "orchestrator.supervisor", "--run-dir", str(run_dir)])


def live_looking_run(run_dir: Path) -> subprocess.Popen:
    """Make ``run_dir`` a run whose state.json says running, its pid a
    :func:`supervisor_stand_in`: its followers never end by themselves. Returns the
    stand-in; the caller kills it."""
    run_dir.mkdir(parents=True)
    sup = supervisor_stand_in(run_dir)
    (run_dir / "state.json").write_text(json.dumps({"run_id": run_dir.name, "run_name": "live",
                                                    "status": "running", "pid": sup.pid,
                                                    "attempt": 1}))
    (run_dir / "events.jsonl").write_text('{"kind": "supervisor_start", "mode": "setsid", '
                                     '"pid": 1, "resumed": false, "t": 1}\n')
    return sup


def dfo(capsys, hosts, *args):
    """The CLI in this process against ``hosts``: (exit code, stdout, stderr)."""
    from orchestrator.cli import main

    rc = main(["--hosts", str(hosts), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def fake_run(root: Path, run_id: str, attempts: int = 2) -> Path:
    """A finished run's directory as the supervisor leaves it (state.json, logs, events)."""
    from dfo_contract.runstate import Attempt, RunState
    from orchestrator.supervisor.runfiles import write_state

    rd = root / "runs" / run_id
    rd.mkdir(parents=True)
    st = RunState.new(run_id, run_id.rsplit("-", 2)[0], now=time.time() - 60)
    st.status, st.ended_at, st.last_step = "done", time.time(), 12
    st.attempts = [Attempt(n=i + 1, started_at=time.time() - 60) for i in range(attempts)]
    st.attempt = attempts
    write_state(str(rd), st)
    for i in range(attempts):
        (rd / f"attempt-{i + 1}.log").write_text(f"attempt {i + 1} says hi\n")
    (rd / "events.jsonl").write_text("")
    return rd
