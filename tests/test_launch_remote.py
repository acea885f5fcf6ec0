"""The two commands a launch runs on the host, run as the host runs them (real processes):
``orchestrator.remote.launch_facts`` (what the facts round trip needs Python for: checkpoints
by manifest, never re-hashed, never promoted in a dry run) and ``orchestrator.remote.run_steps``
(the writes and the start, in order, stopping at the first that fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dfo_contract.replies import RunStep, StepsReply
from dfo_contract.checkpoints import REQUIRED_FILES, write_manifest
from orchestrator.plan import launch_steps as ls
from orchestrator.plan.launch_facts import (FACTS_MARK, FactsRequest, checkpoint_listing,
                                           facts_argv, parse_facts)
from tests.supervisor_env import REPO

ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _ckpt(d: Path, step: int, *, name: str | None = None) -> Path:
    p = d / (name or f"step_{step}")
    p.mkdir(parents=True)
    for f in REQUIRED_FILES:
        (p / f).write_bytes(f"{f}-{step}".encode() * 10)
    write_manifest(str(p), step, list(REQUIRED_FILES), lineage={"run": "r-1", "attempt": 1})
    return p


def _facts(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "orchestrator.remote.launch_facts", *args],
                       capture_output=True, text=True, timeout=120, env=ENV, cwd=str(REPO))
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith(FACTS_MARK)
    return json.loads(line[len(FACTS_MARK):])


def test_checkpoints_are_read_by_manifest_and_a_dry_look_promotes_nothing(tmp_path):
    ck = tmp_path / "ck"
    _ckpt(ck, 2)
    bad = _ckpt(ck, 4)
    weights = bad / "drafter.safetensors"
    weights.write_bytes(b"X" * len(weights.read_bytes()))
    short = _ckpt(ck, 6)
    (short / "optim.pt").write_bytes(b"x")
    orphan = _ckpt(ck, 8, name=".step_8.tmp-999999999")   # a dead writer's complete save
    got = {c["name"]: c for c in _facts("--ckpt", str(ck), "--no-promote")["checkpoints"][str(ck)]}
    # same sizes: valid by its manifest (the weights are verified where they are resumed)
    assert got["step_4"]["valid"] and got["step_2"]["valid"] and got["step_2"]["run"] == "r-1"
    assert not got["step_6"]["valid"] and "truncated" in got["step_6"]["reason"]
    assert "step_8" not in got and orphan.is_dir()          # --no-promote: nothing changed
    got = _facts("--ckpt", str(ck))["checkpoints"][str(ck)]
    assert "step_8" in {c["name"] for c in got} and not orphan.exists()
    assert _facts("--ckpt", str(tmp_path / "none"))["checkpoints"] == {str(tmp_path / "none"): []}


def test_the_other_facts_answer_each_in_its_place(tmp_path):
    (tmp_path / "fingerprint.json").write_text(json.dumps({"torch": "2.13.0+cpu"}))
    (tmp_path / "config.json").write_text("{}")
    cache = tmp_path / "cache"
    (cache / "cpu-k1").mkdir(parents=True)
    (cache / ".gens").mkdir()
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "ep_1").write_text("")
    d = _facts("--fingerprint", str(tmp_path / "fingerprint.json"), "--source",
               "--hash", str(tmp_path / "config.json"), "--hash", str(tmp_path / "nope.json"),
               "--glob", str(tmp_path / "g" / "ep_*"), "--caches", str(cache))
    assert d["fingerprint"] == {"torch": "2.13.0+cpu"} and d["caches"] == ["cpu-k1"]
    assert any(k.startswith("trainer/") for k in d["source"])
    assert d["hashes"][str(tmp_path / "nope.json")] is None
    assert len(d["hashes"][str(tmp_path / "config.json")]) == 64
    assert [p for p, _ in d["glob"]] == [str(tmp_path / "g" / "ep_1")]


def test_the_facts_script_is_one_command_with_every_section(tmp_path):
    """The whole facts command (bash + the env's python) on a root whose env is this venv."""
    root = tmp_path / "root"
    (root / "envs").mkdir(parents=True)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), root / "envs" / "current")
    ck = root / "checkpoints" / "r"
    _ckpt(ck, 3)
    req = FactsRequest(root=str(root), run_lock=str(root / "locks" / "run.lock"),
                       paths=[str(tmp_path / "there"), str(tmp_path / "gone; $(id)")],
                       ckpt_dirs=[str(ck)], fingerprint=str(tmp_path / "fp.json"))
    (tmp_path / "there").write_text("")
    p = subprocess.run(facts_argv(req), capture_output=True, text=True, timeout=120,
                       env=dict(ENV, PATH=os.environ["PATH"]))
    f = parse_facts(p.stdout)
    assert f.complete and f.launch.env == "1" and f.launch.lock == "free"
    assert f.missing == [str(tmp_path / "gone; $(id)")] and not f.checked
    assert [c.name for c in checkpoint_listing(f, str(ck))] == ["step_3"]
    assert f.fingerprint is None


def _steps(steps, cwd) -> dict:
    p = subprocess.run(ls.steps_argv(sys.executable), input=ls.steps_stdin(steps),
                       capture_output=True, timeout=120, env=ENV, cwd=str(cwd))
    return ls.parse_reply(p.stdout.decode())


def test_steps_run_in_order_and_stop_at_the_first_that_fails(tmp_path):
    run = tmp_path / "runs" / "r-1"
    ok = [RunStep(id="parents", run=["mkdir", "-p", "--", str(run.parent)]),
          RunStep(id="run_dir", run=["mkdir", "--", str(run)]),
          ls._write("spec", str(run / "spec.json"), b'{"version": 2}\n'),
          ls._write("record", str(tmp_path / "no" / "such" / "dir" / "rec"), b"x", optional=True),
          RunStep(id="start", run=["sh", "-c", 'echo "$1" > "$2"', "sh", "$(id)", str(run / "out")])]
    assert _steps(ok, tmp_path) == StepsReply(done=5)
    assert (run / "spec.json").read_bytes() == b'{"version": 2}\n'
    assert (run / "out").read_text() == "$(id)\n"
    assert oct((run / "spec.json").stat().st_mode)[-3:] == "644"
    # the run dir exists now: the exclusive mkdir fails, nothing after it runs
    again = _steps([*ok[:2], ls._write("spec", str(run / "spec2.json"), b"{}")], tmp_path)
    assert again and again.failed == "run_dir" and again.exit_code != 0 and "exists" in again.stderr
    assert not (run / "spec2.json").exists()


def test_steps_that_do_not_read_are_refused_with_the_place_named(tmp_path):
    p = subprocess.run(ls.steps_argv(sys.executable),
                       input=json.dumps({"steps": [{"id": "a", "run": "mkdir x"}]}).encode(),
                       capture_output=True, timeout=120, env=ENV, cwd=str(tmp_path))
    reply = ls.parse_reply(p.stdout.decode())
    assert p.returncode == 2 and reply is not None and reply.exit_code == 2
    assert "the launch request's 'steps[0].run' is str 'mkdir x'" in reply.stderr
    assert not (tmp_path / "x").exists()
