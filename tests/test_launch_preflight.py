"""`dfo launch`'s one pre-launch round trip (engine/preflight.py) still names each problem
with its own exit code and in the same order: no env (7), run.lock held (9), a config path
missing on the host (2). Real CLI, local transport, nothing started."""

from __future__ import annotations

import fcntl
import os

from tests.supervisor_env import dfo, hosts_yaml, make_root, write_config


def _assets(tmp_path):
    a = tmp_path / "assets"
    (a / "target").mkdir(parents=True)
    (a / "synth.jsonl").write_text("")
    return a


def test_missing_config_path_is_exit_2_one_line(tmp_path, capsys):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    a = _assets(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", a)
    os.unlink(a / "synth.jsonl")
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--no-env-check", "--dry-run")
    assert rc == 2 and "data.path" in err and "does not exist on local" in err, err
    assert err.count("\n") == 1
    assert not (root / "runs").exists()


def test_held_run_lock_comes_before_a_missing_path(tmp_path, capsys):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    a = _assets(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", a)
    os.unlink(a / "synth.jsonl")
    (root / "locks").mkdir()
    with open(root / "locks" / "run.lock", "w") as f:
        f.write("other-run-1\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)
        rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--no-env-check",
                         "--dry-run")
    assert rc == 9 and "run other-run-1 is live" in err and err.count("\n") == 1, err


def test_no_env_comes_first(tmp_path, capsys):
    root = tmp_path / "bare"
    root.mkdir()
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    cfg = write_config(tmp_path / "c.yaml", tmp_path / "nowhere")
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--dry-run")
    assert rc == 7 and "no deployed env" in err and err.count("\n") == 1, err
