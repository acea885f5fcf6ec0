"""`dfo launch/status/stop/logs` through the real CLI on the local transport, with the real
trainer on CPU: validation errors, a second launch, supervisor death, stop with a checkpoint,
and a crash loop that gives up with exit 10."""

from __future__ import annotations

import json
import os
import signal

import pytest
from pathlib import Path

from orchestrator.supervisor import procs
from tests.supervisor_env import (FAST, dfo, events, hosts_yaml, wait_for, write_config)


def fast_flags():
    out = ["--no-env-check", "--backoff-scale", "0.01"]
    for k, v in FAST.items():
        out += ["--threshold", f"{k}={v}"]
    return out


def state(root, run_id):
    return json.loads((root / "runs" / run_id / "state.json").read_text())


@pytest.mark.parametrize("bad", ["step_690; rm -rf /", "$(reboot)", "../../etc", "/etc/passwd"])
def test_bad_resume_is_rejected_before_anything_starts(local_site, capsys, bad):
    root, hosts, tmp = local_site
    rc, out, err = dfo(capsys, hosts, "launch", "--resume", bad, "--no-env-check")
    assert rc == 2 and err.startswith("dfo: error: --resume") and err.count("\n") == 1
    assert not (root / "runs").exists()


def test_host_without_deployed_env(tmp_path, capsys, tiny_assets):  # noqa: F811
    root = tmp_path / "bare"
    root.mkdir()
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg))
    assert rc == 7 and "no deployed env" in err and "dfo deploy" in err and err.count("\n") == 1
    rc, _, err = dfo(capsys, hosts, "status")
    assert rc == 7 and "no deployed env" in err


def test_dry_run_prints_plan_and_starts_nothing(local_site, capsys, tiny_assets):  # noqa: F811
    root, hosts, tmp = local_site
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--dry-run",
                       "--no-env-check", "--set", "train.micro_batch=4")
    assert rc == 0, err
    assert "setsid -f sh -c" in out and "orchestrator.supervisor.shim trainer train" in out
    assert "--train.micro_batch=4" in out and "TORCHINDUCTOR_CACHE_DIR=" in out
    assert "compile_gate -> layout_ddp -> one_drafter_device -> attention_sdpa" in out
    assert "warm-cache" not in err       # compile.enabled: false: nothing to warm, no advice
    assert not (root / "runs").exists()
    rc, out, _ = dfo(capsys, hosts, "launch", "--config", str(cfg), "--dry-run", "--json",
                     "--no-env-check")
    d = json.loads(out)
    assert d["started"] is False and d["mode"] == "setsid" and d["ladders"]["oom"]


@pytest.mark.slow
def test_live_run_second_launch_supervisor_kill_and_stop(local_site, capsys, tiny_assets):  # noqa: F811
    root, hosts, tmp = local_site
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 2000},
                       checkpoint={"every": 3})
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "long",
                       "--json", *fast_flags())
    assert rc == 0, err
    run_id = json.loads(out)["run_id"]
    try:
        # a live run holds run.lock: a second launch is refused
        wait_for(lambda: (state(root, run_id).get("last_step") or 0) >= 4, 120, "step 4")
        rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--no-env-check")
        assert rc == 9 and f"run {run_id} is live" in err and "--replace" in err
        rc, out, _ = dfo(capsys, hosts, "status", "--json")
        run = json.loads(out)["runs"][0]
        assert rc == 0 and run["run_id"] == run_id and run["shown_status"] == "running"

        # kill -9 the supervisor: its trainer must not stay unwatched
        st = state(root, run_id)
        sup, trainer = st["pid"], st["trainer_pids"][0]
        os.kill(sup, signal.SIGKILL)
        wait_for(lambda: not procs.alive(trainer), 10, "the orphaned trainer to die")
        wait_for(lambda: state(root, run_id)["pid"] not in (sup, None)
                 and state(root, run_id)["attempt"] >= 2, 60, "a restarted supervisor")
        evs = events(root, run_id)
        restarts = [e for e in evs if e.kind == "supervisor_start"]
        assert restarts[-1].resumed is True
        assert [e for e in evs if e.kind == "attempt_end" and e.note]
        new = state(root, run_id)
        assert new["attempts"][-1]["resume"], "the new attempt resumes from a checkpoint"
        # only the new attempt's processes belong to the run
        live = procs.processes_of_run(str(root / "runs" / run_id))
        assert trainer not in live

        log2 = root / "runs" / run_id / f"attempt-{new['attempt']}.log"
        wait_for(lambda: log2.read_text().count('"kind": "step"') >= 2, 120,
                 "steps of the new attempt")
    finally:
        rc, out, err = dfo(capsys, hosts, "stop", "--run", run_id, "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["status"] == "stopped"
    ck = info["last_checkpoint"]
    assert ck and ck["step"] == info["last_step"], "SIGTERM made the trainer checkpoint"
    assert (root / "checkpoints" / "long" / f"step_{ck['step']}" / "manifest.json").exists()
    assert not procs.processes_of_run(str(root / "runs" / run_id))
    # the checkpoints it left can be named; a missing one is refused with the list
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "long",
                     "--resume", "step_690", "--no-env-check")
    assert rc == 11 and "step_690: no such checkpoint" in err and f"step_{ck['step']}" in err
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "long",
                       "--resume", "latest", "--dry-run", "--no-env-check", "--json")
    assert rc == 0 and json.loads(out)["resume"].endswith(f"/step_{ck['step']}")

    # a fresh launch into a run name that has checkpoints is refused, naming the choices
    ckdir = root / "checkpoints" / "long"
    before = sorted(p.name for p in ckdir.iterdir())
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "long",
                     "--dry-run", "--no-env-check")
    assert rc == 2 and "already holds" in err and "--resume latest" in err
    assert "--new-lineage" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in ckdir.iterdir()) == before
    # --new-lineage moves them aside under a dated name (nothing deleted) and starts over
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "long",
                       "--new-lineage", "--json", *fast_flags())
    assert rc == 0, err
    d = json.loads(out)
    new_id, aside = d["run_id"], d["move_aside"]
    try:
        assert d["resume"] is None and aside.startswith(str(ckdir) + ".")
        assert sorted(p.name for p in Path(aside).iterdir()) == before
    finally:
        rc, out, err = dfo(capsys, hosts, "stop", "--run", new_id, "--json")
    assert rc == 0, err
    assert sorted(p.name for p in Path(aside).iterdir()) == before


@pytest.mark.slow
def test_crash_loop_gives_up_with_exit_10(local_site, capsys, tiny_assets):  # noqa: F811
    root, hosts, tmp = local_site
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "loop",
                       "--fault", "exit=1@2#*", "--budget", "crash=2", "-f", *fast_flags())
    assert rc == 10, (out, err)
    assert "failed" in err and "crash" in err
    run_id = next(p.name for p in (root / "runs").iterdir())
    st = state(root, run_id)
    assert st["status"] == "failed" and st["attempt"] == 3
    assert "restart budget for crash spent (2)" in st["reason"]
    assert any("fault injection: exit" in e["text"] or "exit 1" in e["text"]
               for e in st["evidence"])
    assert "attempt 3 classified crash" in out or "classified crash" in out


@pytest.mark.slow
def test_replace_stops_the_live_run_first(local_site, capsys, tiny_assets):  # noqa: F811
    root, hosts, tmp = local_site
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 2000},
                       checkpoint={"every": 3})
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "old",
                       "--json", *fast_flags())
    assert rc == 0, err
    old = json.loads(out)["run_id"]
    wait_for(lambda: (state(root, old).get("last_step") or 0) >= 2, 120, "old run training")
    rc, out, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--run-name", "new",
                       "--replace", "--json", *fast_flags())
    assert rc == 0, err
    new = json.loads(out)["run_id"]
    try:
        st = state(root, old)
        assert st["status"] == "stopped" and st["last_checkpoint"]
        assert (root / "locks" / "run.lock").read_text().strip() == new
        rc, out, _ = dfo(capsys, hosts, "status", "--json", "--run", new)
        assert json.loads(out)["runs"][0]["live"]
    finally:
        rc, _, err = dfo(capsys, hosts, "stop", "--run", new)
    assert rc == 0, err
