"""A live run's directory deleted under it: the real supervisor (solo, local) running the
real trainer on CPU notices within a poll, kills the trainer, gives run.lock back, says so
on stderr (the journal under systemd) and exits 3 (RUN_DIR_UNUSABLE_EXIT), which neither systemd
(RestartPreventExitStatus) nor the setsid script restarts. A live run's directory made
read-only (a real read-only bind mount over it) ends the run the same way, once, and
``dfo status`` and ``dfo logs -f`` read why from the notice the supervisor left beside it."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec
from orchestrator.common.budget import BudgetPolicy
from orchestrator.common.fallback import merge_ladders
from orchestrator.common.launch_argv import RUN_DIR_UNUSABLE_EXIT, SETSID_SCRIPT, supervisor_argv
from orchestrator.common.launch_argv import flatten
from orchestrator.config.host_tree import HostTree
from orchestrator.plan.run_identity import make_run_id
from orchestrator.plan.thresholds import thresholds as thresholds_of
from orchestrator.supervisor.procs import processes_of_run
from orchestrator.cli import main
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.supervisor.runfiles import notice_paths
from orchestrator.transport.local import LocalTransport
from tests.helpers.tmpfs import read_only  # noqa: F401
from tests.supervisor_env import (FAST, REPO, hosts_yaml, local_host, make_root, wait_for,
                                  write_config)


def test_setsid_script_does_not_restart_a_supervisor_whose_run_dir_is_gone(tmp_path):
    log, count = tmp_path / "log", tmp_path / "count"
    body = f'echo x >> {count}; exit {RUN_DIR_UNUSABLE_EXIT}'
    r = subprocess.run(["sh", "-c", SETSID_SCRIPT, "dfo-supervisor", str(log), "sh", "-c", body],
                       timeout=60)
    assert r.returncode == RUN_DIR_UNUSABLE_EXIT
    assert count.read_text() == "x\n"
    assert "run directory is gone or read-only; not restarted" in log.read_text()


@pytest.mark.slow
def test_deleting_a_live_runs_directory_ends_it_non_zero(tmp_path, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    tree = HostTree(str(root))
    run_id = make_run_id("gone", time.time())
    run_dir = tree.run_dir(run_id)
    os.makedirs(run_dir)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 100000},
                       checkpoint={"every": 100000})
    (tmp_path / "run.yaml").write_text(cfg.read_text())
    spec = RunSpec(
        identity=Identity(run_id=run_id, run_name="gone", host="local", root=str(root),
                          python=sys.executable, lock=tree.run_lock),
        config=Config(path=str(tmp_path / "run.yaml"),
                      base=flatten(yaml.safe_load(cfg.read_text()))),
        resume=Resume(checkpoint_dir=tree.checkpoints("gone")),
        thresholds=thresholds_of(dict(FAST)), budget=BudgetPolicy(scale=0.01),
        ladders={k: tuple(v) for k, v in merge_ladders().items()}, trainer=Bundled())
    with open(os.path.join(run_dir, "spec.json"), "w") as f:
        json.dump(spec.to_json(), f)
    err = open(tmp_path / "stderr", "w+")
    sup = subprocess.Popen(supervisor_argv(sys.executable, run_dir), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=err, cwd=str(tmp_path),
                           env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True)
    try:
        def trained():
            try:
                st = json.loads(open(os.path.join(run_dir, "state.json")).read())
            except (OSError, ValueError):
                return False
            return (st.get("last_step") or 0) >= 1
        wait_for(trained, 240, "a training step")
        trainers = processes_of_run(run_dir)
        assert trainers
        # rm -rf as a person would; writers may still add files while it walks: again
        # until the directory is gone
        wait_for(lambda: shutil.rmtree(run_dir, ignore_errors=True) or not os.path.exists(run_dir),
                 60, "the run directory to be deleted", poll=0.05)
        rc = sup.wait(timeout=120)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert rc == RUN_DIR_UNUSABLE_EXIT
    err.seek(0)
    text = err.read()
    assert (f"dfo-supervisor: run {run_id}: the run directory {run_dir} was deleted while the "
            "run was live; the run ends") in text, text
    assert "Traceback" not in text
    assert processes_of_run(run_dir) == []
    fd = os.open(tree.run_lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # given back
    finally:
        os.close(fd)


#: a command of one's own that reports a step every 0.2 s until it is stopped
STEPS = ("import time\nfor i in range(1, 10**6):\n"
         "    print(f'step {i} loss 1.0 tok/s 10', flush=True)\n    time.sleep(0.2)\n")


def test_a_read_only_run_directory_ends_the_run_once_and_status_says_why(
        tmp_path, read_only, capsys, monkeypatch):  # noqa: F811
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    root = make_root(tmp_path)
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    run_id = run_ops.launch(LaunchOptions(
        command=[sys.executable, str(script)], run_name="ro", backoff_scale=0.01,
        step_pattern=r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)",
        thresholds=dict(FAST), env_check=False)).run_id
    run_dir = root / "runs" / run_id
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= 2, 120, "steps")
    pid = run_ops.status(run_id)[0].state.pid
    read_only(run_dir)       # the next state.json the supervisor writes meets EROFS

    def ended():
        info = run_ops.status(run_id)[0]
        return info if info.state.status != "running" else None
    info = wait_for(ended, 120, "the run to end")
    assert info.state.status == info.shown_status == "failed" and not info.live, info
    assert info.state.reason.startswith(f"the run directory {run_dir} is read-only (EROFS "
                                        f"writing {run_dir}/"), info.state.reason
    assert info.state.reason.endswith("then dfo launch --resume latest")
    assert info.notice == notice_paths(str(run_dir))[0]
    # nothing could be written in the directory: its state.json still names the supervisor
    assert json.loads((run_dir / "state.json").read_text())["pid"] == pid
    wait_for(lambda: not processes_of_run(str(run_dir)), 60, "the run's processes to go")
    # once, not a supervisor restarted into the same error
    log = (run_dir / "supervisor.log").read_text()
    assert "Traceback" not in log and log.count("is read-only") == 1, log
    if info.state.mode == "setsid":     # under systemd: RestartPreventExitStatus
        assert "run directory is gone or read-only; not restarted" in log
    # a supervisor started again on the read-only directory (systemd's Restart=, by hand)
    # ends at once the same way, and the run still reads as failed
    p = subprocess.run(supervisor_argv(sys.executable, str(run_dir)), capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == RUN_DIR_UNUSABLE_EXIT and "Traceback" not in p.stderr, p.stderr
    assert f"the run directory {run_dir} is read-only" in p.stderr
    assert run_ops.status(run_id)[0].state.status == "failed"
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    assert main(["--hosts", str(hosts), "status", "--run", run_id]) == 0
    err = capsys.readouterr().err
    assert f"run {run_id} failed: the run directory {run_dir} is read-only" in err
    # logs -f ends at once with the run's failure, not "lost" after a wait
    assert main(["--hosts", str(hosts), "logs", "-f", "--run", run_id]) == 10
    err = capsys.readouterr().err
    assert "is read-only" in err and "lost" not in err, err
