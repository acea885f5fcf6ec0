"""A full disk is its own failure class, with a real tmpfs as the checkpoint filesystem:
the trainer removes its partial checkpoint, keeps the complete ones and ends with exit 7
and one line naming the filesystem and the space it needs; the supervisor stops at once
(``disk_full`` is permanent) with that line as the reason, instead of retraining the same
steps into the same full disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dfo_contract import checkpoints as cm
from dfo_contract.exitcodes import DISK_FULL
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.transport.local import LocalTransport
from tests.helpers.tmpfs import fill as _fill, read_only, tmpfs  # noqa: F401
from tests.helpers.trainer import make_synth, make_target, run_trainer, tiny_overrides
from tests.supervisor_env import FAST, events, local_host, make_root, wait_final, write_config

pytestmark = pytest.mark.slow


def _tree_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def test_a_checkpoint_that_does_not_fit_is_exit_7_and_keeps_the_complete_ones(tmp_path, tmpfs):  # noqa: F811
    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "d.jsonl"), num=64)
    fs = tmpfs(64 << 20)
    ck = fs / "ck"
    args = tiny_overrides(target, data, str(tmp_path / "run"),
                          **{"train.max_steps": 2, "checkpoint.every": 2, "checkpoint.dir": ck})
    r = run_trainer(["train", *args], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    size = _tree_bytes(ck / "step_2")
    # an earlier attempt killed mid-save left its partial temp dir (its writer is dead)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = ck / f".step_3.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 4096)
    _fill(fs, size // 2)                  # less than one more checkpoint is free now
    args = tiny_overrides(target, data, str(tmp_path / "run"),
                          **{"train.max_steps": 4, "checkpoint.every": 2, "checkpoint.dir": ck})
    r = run_trainer(["train", *args, "--resume", str(ck / "step_2")], timeout=600)
    assert r.returncode == DISK_FULL, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"trainer: disk full: the filesystem at {fs} is full ("), line
    assert f"checkpoint step_4 in {ck} needs " in line and "Traceback" not in r.stderr
    from dfo_contract.fsio import human_bytes
    assert f"needs {human_bytes(size)} (" in line          # the size of a complete one
    assert sorted(p.name for p in ck.iterdir()) == ["step_2"]   # no partial left, no stale one
    assert cm.verify(str(ck / "step_2"))[0]


def test_the_supervisor_stops_at_once_on_a_full_disk(tmp_path, tmpfs, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    fs = tmpfs(64 << 10, root / "checkpoints")   # not even one checkpoint fits
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="t", backoff_scale=0.01,
                                    thresholds=dict(FAST), env_check=False))
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "failed"
    starts = [e for e in evs if e.kind == "attempt_start"]
    cl = [e for e in evs if e.kind == "classified"]
    assert len(starts) == 1 and [c.cls for c in cl] == ["disk_full"]   # no retry
    assert cl[0].reason.startswith(f"disk full: the filesystem at {fs} is full (")
    assert "disk full: the filesystem at" in info["reason"] and "restarting cannot help" in info["reason"]
    assert not [p for p in fs.rglob(".step_*")]                # the partial one was removed


# --- a read-only checkpoint filesystem ------------------------------------------------------

def test_a_real_erofs_is_its_own_permanent_class_naming_the_path(tmp_path, read_only):  # noqa: F811
    from orchestrator.common.classify import classify

    ro = read_only(tmp_path / "ro")
    p = subprocess.run([sys.executable, "-c", f"open({str(ro / 'step_2')!r}, 'w')"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "Read-only file system" in p.stderr
    d = classify(p.stderr.splitlines(), exit_code=1)
    assert d.cls == "read_only" and d.permanent
    assert d.reason.startswith(f"{ro / 'step_2'} is on a read-only filesystem (EROFS)")
    assert "checkpoint.dir" in d.reason


def test_a_file_open_for_writing_through_the_bind_delays_the_read_only_remount(
        tmp_path, read_only):  # noqa: F811
    """A live process with a file open for writing in the directory (a supervisor saving
    state.json) makes the remount "busy": the fixture waits for the close, then the
    directory is read-only."""
    where = tmp_path / "ro"
    held: list = []
    busy: list[int] = []

    def open_one():
        held.append(open(where / "state.json.tmp", "w"))

    def close_it():
        busy.append(1)
        held[0].write("{}")
        held[0].close()

    read_only(where, between=open_one, on_busy=close_it)
    assert busy == [1] and held[0].closed          # busy once, then the remount took
    assert (where / "state.json.tmp").read_text() == "{}"
    with pytest.raises(OSError, match="Read-only file system"):
        (where / "state.json").write_text("{}")


def test_erofs_on_a_checkpoint_being_written_names_the_checkpoint_dir(tmp_path, read_only):  # noqa: F811
    """The trainer writes a checkpoint into DIR/.step_N.tmp-PID first: the reason names DIR,
    the directory a user can act on, not the temporary one."""
    from orchestrator.common.classify import classify

    ro = read_only(tmp_path / "ro")
    tmp = ro / ".step_2.tmp-4242"
    p = subprocess.run([sys.executable, "-c", f"import os; os.makedirs({str(tmp)!r})"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "Read-only file system" in p.stderr and str(tmp) in p.stderr
    d = classify(p.stderr.splitlines(), exit_code=1)
    assert d.cls == "read_only"
    assert d.reason.startswith(f"{ro} is on a read-only filesystem (EROFS)"), d.reason
    assert ".tmp-" not in d.reason


def test_the_supervisor_stops_at_once_on_a_read_only_checkpoint_dir(tmp_path, read_only,  # noqa: F811
                                                                    tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    ck = read_only(root / "checkpoints" / "t")   # the run name's checkpoint directory
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="t", backoff_scale=0.01,
                                    thresholds=dict(FAST), env_check=False))
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "failed"
    starts = [e for e in evs if e.kind == "attempt_start"]
    cl = [e for e in evs if e.kind == "classified"]
    assert len(starts) == 1 and [c.cls for c in cl] == ["read_only"]   # no retry
    assert "read-only" in info["reason"] and str(ck) in info["reason"]
    assert "restarting cannot help" in info["reason"]


def test_a_first_checkpoint_that_wrote_nothing_names_the_free_space_not_zero_bytes(
        tmp_path, tmpfs):  # noqa: F811
    import errno

    from trainer.core import diskfull

    fs = tmpfs(64 << 10)
    root = fs / "ck"
    partial = root / ".step_2.tmp-1"
    partial.mkdir(parents=True)
    _fill(fs, 0)
    try:
        (partial / "drafter.safetensors").write_bytes(b"x" * 4096)
    except OSError as e:
        exc = e
    else:
        pytest.fail("the tmpfs took a write after it was filled")
    assert exc.errno == errno.ENOSPC
    msg = str(diskfull.error(str(root), 2, str(partial), exc))
    assert "needs more than 0 B" not in msg and "checkpoint step_2" in msg, msg
    import re
    assert re.search(r"needs more than the [\d.]+ (B|KiB) free", msg), msg
    assert not partial.exists()
