"""Ctrl-C during `dfo launch` (SIGINT to its process group, as a terminal sends it) at each
stage of a real launch on the local transport (held there by a gate the test opens): what the message says is what the host
holds. Before the run's steps are sent nothing exists; once they are sent they run to their
end (the run dir, config.yaml, spec.json and the supervisor), the run is listed by
`dfo status` and goes on, and no compile-cache copy is made by anything but its supervisor."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervisor_env import FAST, REPO, dfo, hosts_yaml, make_root, wait_for, write_config

CLI = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"


def _flags() -> list[str]:
    out = ["--no-env-check", "--backoff-scale", "0.01"]
    for k, v in FAST.items():
        out += ["--threshold", f"{k}={v}"]
    return out


#: holds a process at one moment of the launch until the test lets it go (GATE/go): a
#: ``sitecustomize`` for the Python processes (matched by a module in their argv) and a
#: ``mkdir`` first on PATH for the run dir's exclusive creation (inside the launch's steps)
SITE = """
import os, time
gate, module = os.environ.get("TEST_GATE_DIR"), os.environ.get("TEST_GATE_MODULE")
if gate and module:
    with open("/proc/self/cmdline", "rb") as f:
        if module.encode() in f.read().split(b"\\0"):
            open(os.path.join(gate, "arrived"), "w").close()
            while not os.path.exists(os.path.join(gate, "go")):
                time.sleep(0.02)
"""
MKDIR = """#!/bin/bash
if [[ -n $TEST_GATE_MKDIR && $1 == -- && $2 == */runs/* ]]; then
  : >"$TEST_GATE_DIR/arrived"
  while [[ ! -e $TEST_GATE_DIR/go ]]; do sleep 0.02; done
fi
exec {real} "$@"
"""

#: where Ctrl-C is pressed: the gate that holds the launch there
STAGES = {
    # round trip 1, the host's facts: nothing written yet
    "facts": {"TEST_GATE_MODULE": "orchestrator.remote.launch_facts"},
    # round trip 2 sent: its steps are about to create the run dir
    "steps": {"TEST_GATE_MKDIR": "1"},
    # the supervisor started; launch waits for it to take run.lock
    "supervisor": {"TEST_GATE_MODULE": "orchestrator.supervisor"},
}


def _gated_env(tmp: Path, stage: str) -> tuple[dict, Path]:
    gate = tmp / "gate"
    (gate / "site").mkdir(parents=True)
    (gate / "bin").mkdir()
    (gate / "site" / "sitecustomize.py").write_text(SITE)
    mk = gate / "bin" / "mkdir"
    mk.write_text(MKDIR.format(real=shutil.which("mkdir")))
    mk.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=f"{gate / 'site'}:{REPO}", NO_COLOR="1",
               PATH=f"{gate / 'bin'}:{os.environ['PATH']}", TEST_GATE_DIR=str(gate),
               **STAGES[stage])
    return env, gate


@pytest.mark.parametrize("stage", list(STAGES))
def test_ctrl_c_during_launch_says_what_it_left(tmp_path, capsys, tiny_assets, stage):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 8})
    env, gate = _gated_env(tmp_path, stage)
    p = subprocess.Popen([sys.executable, "-c", CLI, "--hosts", str(hosts), "launch",
                          "--config", str(cfg), *_flags()], cwd=str(REPO), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        wait_for(lambda: (gate / "arrived").exists() or p.poll() is not None, timeout=240,
                 what=f"the launch to reach {stage}", poll=0.05)
        assert p.poll() is None, f"launch ended before {stage}: {p.communicate()}"
        os.killpg(p.pid, signal.SIGINT)     # what a terminal's Ctrl-C does
        (gate / "go").touch()
        out, err = p.communicate(timeout=180)
    finally:
        (gate / "go").touch()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, (out, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("dfo: interrupted: "), err
    run_dirs = sorted((root / "runs").glob("*")) if (root / "runs").exists() else []
    if stage == "facts":
        assert line == "dfo: interrupted: no run was started on local", err
        assert run_dirs == [], "a launch that says it started nothing left a run dir"
        return
    # the steps were sent: the run exists whole, is listed, and its supervisor owns it
    assert len(run_dirs) == 1, (run_dirs, line)
    rd = run_dirs[0]
    assert f"run {rd.name} started on local and goes on" in line, line
    assert f"dfo stop --host local --run {rd.name}" in line
    assert (rd / "spec.json").exists() and (rd / "config.yaml").exists()
    assert not (rd / ".cache.tmp").exists()
    rc, sout, serr = dfo(capsys, hosts, "status", "--run", rd.name, "--json")
    assert rc == 0, serr
    wait_for(lambda: (rd / "state.json").exists()
             and json.loads((rd / "state.json").read_text())["status"] in ("done", "failed"),
             timeout=300, what="the run to end")
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "done", state.get("reason")
    kinds = [json.loads(ln) for ln in (rd / "events.jsonl").read_text().splitlines()]
    seeded = [e for e in kinds if e["kind"] == "cache_restore"]
    assert seeded and seeded[0]["ok"] and "seeded" in seeded[0]["detail"]
    assert (rd / "cache" / "inductor").is_dir()
