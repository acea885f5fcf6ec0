"""Checkpoint lineage: manifests name their run; resume/prune stay within a run; re-saves
swap atomically and a crash mid-swap leaves a loadable checkpoint. Torch-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dfo_contract.state_records import CheckpointRef
from dfo_contract import checkpoints as cm
from dfo_contract import fsio
from orchestrator.common.launch_argv import attempt_env
from trainer.core import checkpoints as tc
from trainer.env import read_env


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def fake_ckpt(path, step, *, run=None, attempt=1, tag="x"):
    """A complete checkpoint dir made by hand: fake files + write_manifest."""
    os.makedirs(path)
    for name in cm.REQUIRED_FILES:
        with open(os.path.join(path, name), "w") as f:
            f.write(f"{name} {step} {tag}\n")
    cm.write_manifest(str(path), step, list(cm.REQUIRED_FILES),
                      lineage={"run": run, "attempt": attempt} if run else None)
    return str(path)


def tag_of(path):
    with open(os.path.join(path, "config.yaml")) as f:
        return f.read().split()[-1]


# --- 1. lineage in the manifest ---------------------------------------------------------

def test_manifest_records_lineage_and_older_ones_still_verify(tmp_path):
    p = fake_ckpt(tmp_path / "step_3", 3, run="run-a", attempt=2)
    man = cm.read_manifest(p)
    assert man["format"] == 1 and man["lineage"] == {"run": "run-a", "attempt": 2}
    old = fake_ckpt(tmp_path / "step_2", 2)  # no lineage: an older checkpoint
    assert "lineage" not in cm.read_manifest(old)
    assert cm.verify(old, expect_step=2) == (True, "")
    infos = {c.name: c for c in cm.list_checkpoints(str(tmp_path))}
    assert infos["step_3"].run == "run-a" and infos["step_2"].run is None
    assert infos["step_3"].to_json()["run"] == "run-a"


def test_run_id_travels_supervisor_env_to_trainer_env():
    e = attempt_env({}, attempt=2, run_dir="/d", fault=None, run_id="20250101-000000-t")
    assert e["DFO_RUN_ID"] == "20250101-000000-t"
    assert read_env(e).run_id == "20250101-000000-t" and read_env(e).attempt == 2


# --- 2. which checkpoint a restart resumes from -----------------------------------------

def test_newest_of_run_never_takes_another_runs_newer_checkpoint(tmp_path):
    root = str(tmp_path)
    fake_ckpt(tmp_path / "step_262", 262, run="old-run")
    fake_ckpt(tmp_path / "step_20", 20, run="new-run")
    fake_ckpt(tmp_path / "step_10", 10, run="new-run")
    assert cm.newest_valid(root)[0].name == "step_262"  # the newest of any run
    best, skipped = cm.newest_of_run(root, "new-run")
    assert best.name == "step_20" and best.run == "new-run" and skipped == []
    assert cm.newest_of_run(root, "third-run") == (None, [])
    assert cm.newest_of_run(root, "old-run")[0].name == "step_262"


def test_newest_of_run_skips_own_torn_checkpoint_and_reports_it(tmp_path):
    root = str(tmp_path)
    fake_ckpt(tmp_path / "step_4", 4, run="r")
    torn = fake_ckpt(tmp_path / "step_8", 8, run="r")
    os.unlink(os.path.join(torn, "rng.pt"))
    fake_ckpt(tmp_path / "step_9", 9, run="other")
    best, skipped = cm.newest_of_run(root, "r")
    assert best.name == "step_4" and [c.name for c in skipped] == ["step_8"]


def test_supervisor_resume_target_own_run_else_named_resume_else_scratch(tmp_path):
    from dfo_contract.runstate import RunState
    from orchestrator.supervisor.source import BundledSource

    from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec

    root = str(tmp_path)
    fake_ckpt(tmp_path / "step_262", 262, run="old-run")
    named = fake_ckpt(tmp_path / "step_100", 100, run="old-run")

    def spec_with(resume):
        return RunSpec(identity=Identity(run_id="new-run", run_name="new", host="local",
                                         root=root, python="python", lock=f"{root}/run.lock"),
                       config=Config(path=f"{root}/config.yaml"),
                       resume=Resume(checkpoint_dir=root, path=resume))

    def target(spec, last_checkpoint):
        """The bundled source's choice with this run's state (attempt 1 ended)."""
        state = RunState.new("new-run", "new", now=0.0)
        state.last_checkpoint, state.attempt = last_checkpoint, 1
        return BundledSource(spec, Bundled(), root, emit=lambda e: e).resume_target(state)

    spec = spec_with(named)
    saved = CheckpointRef(step=5, path="x")
    # this run saved nothing usable (yet): exactly the checkpoint launch named, never step_262
    assert target(spec, saved) == named
    assert target(spec_with(None), saved) is None
    fake_ckpt(tmp_path / "step_5", 5, run="new-run")
    assert target(spec, saved) == os.path.join(root, "step_5")
    assert target(spec, None) == named  # attempt 1: what launch named


# --- 3. prune stays within its run ------------------------------------------------------

def test_prune_with_run_id_never_deletes_another_runs_checkpoint(tmp_path):
    root = str(tmp_path)
    fake_ckpt(tmp_path / "step_262", 262, run="old-run")
    fake_ckpt(tmp_path / "step_250", 250, run="old-run")
    for s in (5, 10, 15, 20):
        fake_ckpt(tmp_path / f"step_{s}", s, run="new-run")
    removed = tc.prune(root, 2, run_id="new-run")
    assert sorted(os.path.basename(p) for p in removed) == ["step_10", "step_5"]
    left = sorted(os.listdir(root))
    assert left == ["step_15", "step_20", "step_250", "step_262"]


def test_prune_without_run_id_keeps_todays_behaviour(tmp_path):
    root = str(tmp_path)
    fake_ckpt(tmp_path / "step_262", 262, run="old-run")
    fake_ckpt(tmp_path / "step_20", 20, run="new-run")
    fake_ckpt(tmp_path / "step_10", 10)
    tc.prune(root, 1)
    assert os.listdir(root) == ["step_262"]


# --- 4. re-saves swap atomically; a crash mid-swap leaves a loadable checkpoint --------

def test_replace_dir_exchanges_atomically(tmp_path, monkeypatch):
    root = tmp_path
    final = fake_ckpt(root / "step_20", 20, run="r", tag="old")
    tmp = fake_ckpt(root / f".step_20.tmp-{os.getpid()}", 20, run="r", tag="new")
    calls = []
    real = fsio._renameat2_exchange

    def spy(a, b):
        ok = real(a, b)
        calls.append(ok)
        if ok:  # right after the exchange: both exist, step_20 is the new one
            assert tag_of(final) == "new" and tag_of(a) == "old"
        return ok

    monkeypatch.setattr(fsio, "_renameat2_exchange", spy)
    monkeypatch.setattr(fsio.os, "replace", lambda *a: pytest.fail("renamed without exchange"))
    fsio.replace_dir(tmp, final, old=str(root / f".step_20.old-{os.getpid()}"))
    if calls != [True]:
        pytest.skip("renameat2(RENAME_EXCHANGE) not supported on this filesystem")
    assert tag_of(final) == "new" and sorted(os.listdir(root)) == ["step_20"]
    assert cm.verify(final, expect_step=20) == (True, "")


@pytest.mark.parametrize("why", ["nosymbol", "enosys"])
def test_replace_dir_falls_back_to_rename_pair(tmp_path, monkeypatch, why):
    final = fake_ckpt(tmp_path / "step_20", 20, tag="old")
    tmp = fake_ckpt(tmp_path / f".step_20.tmp-{os.getpid()}", 20, tag="new")
    if why == "nosymbol":
        class NoLibc:
            def __getattr__(self, name):
                raise AttributeError(name)
        monkeypatch.setattr(fsio.ctypes, "CDLL", lambda *a, **k: NoLibc())
    else:
        class Libc:
            class renameat2:  # noqa: N801
                argtypes = restype = None

                def __new__(cls, *a):
                    return -1
        monkeypatch.setattr(fsio.ctypes, "CDLL", lambda *a, **k: Libc())
        monkeypatch.setattr(fsio.ctypes, "get_errno", lambda: 38)  # ENOSYS
    assert fsio._renameat2_exchange(tmp, final) is False
    fsio.replace_dir(tmp, final, old=str(tmp_path / f".step_20.old-{os.getpid()}"))
    assert tag_of(final) == "new" and sorted(os.listdir(tmp_path)) == ["step_20"]


@pytest.mark.parametrize("kind", ["tmp", "old"])
def test_complete_orphan_of_dead_writer_is_promoted_not_deleted(tmp_path, kind):
    root = str(tmp_path)
    orphan = fake_ckpt(tmp_path / f".step_20.{kind}-{dead_pid()}", 20, run="r", tag=kind)
    assert cm.stale_tmp_dirs(root) == []  # the only copy of step_20: not stale
    infos = cm.list_checkpoints(root)
    assert [(c.name, c.valid, c.run) for c in infos] == [("step_20", True, "r")]
    assert not os.path.exists(orphan) and tag_of(os.path.join(root, "step_20")) == kind
    assert tc.prune(root, 1, run_id="r") == []


def test_crash_between_fallback_renames_prefers_new_and_prune_cleans_the_rest(tmp_path):
    root = str(tmp_path)
    pid = dead_pid()
    fake_ckpt(tmp_path / f".step_20.old-{pid}", 20, run="r", tag="old")
    fake_ckpt(tmp_path / f".step_20.tmp-{pid}", 20, run="r", tag="new")
    torn = fake_ckpt(tmp_path / f".step_30.tmp-{pid}", 30, run="r", tag="torn")
    os.unlink(os.path.join(torn, cm.MANIFEST))
    assert sorted(os.path.basename(p) for p in cm.stale_tmp_dirs(root)) == [f".step_30.tmp-{pid}"]
    best, _ = cm.newest_of_run(root, "r")
    assert best.name == "step_20" and tag_of(best.path) == "new"
    removed = tc.prune(root, 1, run_id="r")
    assert sorted(os.path.basename(p) for p in removed) == [f".step_20.old-{pid}", f".step_30.tmp-{pid}"]
    assert os.listdir(root) == ["step_20"]


def test_live_writers_tmp_is_left_alone(tmp_path):
    root = str(tmp_path)
    fake_ckpt(tmp_path / f".step_20.tmp-{os.getpid()}", 20, run="r")
    assert cm.list_checkpoints(root) == [] and cm.stale_tmp_dirs(root) == []
    assert json.loads(json.dumps(cm.promote_orphans(root))) == []
