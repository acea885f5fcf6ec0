"""spec.json as a typed, versioned RunSpec (dfo_contract.runspec, dfo_contract.runlimits):
JSON round trips, one-line refusals, and the supervisor refusing a spec it cannot read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dfo_contract.own_ladder import LadderStep
from dfo_contract.errors import ContractError
from dfo_contract.runlimits import DEFAULT_PER_CLASS, Budget, Thresholds
from dfo_contract.runspec import (SPEC_VERSION, Bundled, Cache, Config, Group, Identity, Own,
                                  Resume, ResumeRule, RunSpec, Solo, Standby)
from tests.supervisor_env import REPO

ID = Identity(run_id="r-20261201-000000-0a1b2c", run_name="r", host="lab", root="/root/dfo",
              python="/root/dfo/envs/current/bin/python", lock="/root/dfo/locks/run.lock")


def _bundled(**kw) -> RunSpec:
    return RunSpec(identity=ID,
                   config=Config(path="/root/dfo/runs/r/config.yaml",
                                 base={"train.micro_batch": 8, "parallel.drafter_devices": ["cpu"]},
                                 overrides={"compile.gate": True}),
                   resume=Resume(checkpoint_dir="/root/dfo/checkpoints/r",
                                 path="/root/dfo/checkpoints/r/step_4"),
                   thresholds=Thresholds(train_s=8.0, poll_s=0.1),
                   budget=Budget(per_class={**DEFAULT_PER_CLASS, "crash": 2}, scale=0.01),
                   ladders={"oom": ("halve_micro_batch*",)},
                   cache=Cache(key="cpu-abc", env={"DFO_CACHE_KEY": "cpu-abc"},
                               restore_argv=("sh", "-c", "x", "a b")),
                   standby=Standby(enabled=False, env={"OMP_NUM_THREADS": "7"}),
                   trainer=Bundled(fault="oom@3"), **kw)


def _roundtrip(spec: RunSpec) -> RunSpec:
    return RunSpec.from_json(json.loads(json.dumps(spec.to_json())))


def test_bundled_own_and_group_specs_survive_json():
    b = _bundled()
    assert _roundtrip(b) == b and b.to_json()["version"] == SPEC_VERSION
    assert b.to_json()["trainer"] == {"kind": "bundled", "fault": "oom@3", "layout": "single",
                                      "nproc": 1, "dense_expected": False}
    assert b.to_json()["role"] == {"kind": "solo"} and isinstance(_roundtrip(b).role, Solo)
    own = RunSpec(identity=ID, config=Config(path="/r/run-file.yaml"),
                  resume=Resume(checkpoint_dir="/r/runs/x"),
                  trainer=Own(command=("python", "t.py", "$(id)"), cwd="/srv/p",
                              step_pattern=r"step (?P<step>\d+)", env={"A": "1"},
                              resume=ResumeRule(glob="ck/*", order="mtime",
                                                args=("--from={path}",)),
                              fallbacks={"oom": (LadderStep(set_arg={"--bs": "2"}),
                                                 LadderStep(drop_arg="--x"))}))
    got = _roundtrip(own)
    assert got == own and got.own is not None and got.own.command[-1] == "$(id)"
    g = Group(name="pair", nodes=("a", "b"), node=1, head_addr="10.0.0.1", port=29400,
              coord_port=29401, nproc=2, env={"GLOO_SOCKET_IFNAME": "mn0"})
    grp = _bundled(role=g)
    assert _roundtrip(grp) == grp and grp.group.host == "b" and not grp.group.is_head
    assert grp.to_json()["role"]["kind"] == "group" and grp.group.rdzv_id("x", 3) == "x-a3"


def test_config_merges_overrides_over_the_base():
    c = _bundled().config
    assert c.merged() == {"train.micro_batch": 8, "parallel.drafter_devices": ["cpu"],
                          "compile.gate": True}
    assert c.merged({"train.micro_batch": 4})["train.micro_batch"] == 4
    assert "compile.gate" not in c.merged({})


@pytest.mark.parametrize("raw, needle", [
    ({"version": 1, "run_id": "x"}, "version 1 is not one this supervisor reads"),
    ({}, "version None"),
    ([], "expected a JSON object"),
    ({**_bundled().to_json(), "cache": {"restore_argv": ["a", 1]}}, "'cache.restore_argv'"),
    ({**_bundled().to_json(), "identity": {"run_id": 3}}, "spec.json's 'identity.run_id' is int 3"),
    ({**_bundled().to_json(), "trainer": {"kind": "mine"}},
     "'trainer.kind' is 'mine', expected one of bundled, own"),
    ({**_bundled().to_json(), "role": {"name": "g"}}, "'role.kind' is None, expected one of"),
    ({k: v for k, v in _bundled().to_json().items() if k != "resume"}, "lacks its 'resume' field"),
    ({**_bundled().to_json(), "thresholds": {"warmup_s": "soon"}}, "thresholds.warmup_s"),
    ({**_bundled().to_json(), "thresholds": {"nap_s": 1}}, "'thresholds.nap_s' is unknown"),
    ({**_bundled().to_json(), "thresholds": {"train_s": 0}},
     "spec.json's thresholds.train_s: expected a positive number, got 0"),
    ({**_bundled().to_json(), "budget": {"scale": -1}},
     "spec.json's budget.scale: expected a positive number"),
])
def test_a_spec_it_cannot_read_is_refused_in_one_line(raw, needle):
    with pytest.raises(ContractError) as e:
        RunSpec.from_json(raw)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_thresholds_defaults_zero_and_integers():
    t = Thresholds.from_user({"hang_s": 0, "skip_steps": 0, "collapse_steps": 3.0})
    assert t.hang_s == 0.0 and t.skip_steps == 0 and t.collapse_steps == 3
    assert Thresholds.from_user(None) == Thresholds() and Thresholds().warmup_s == 900.0
    for bad in ({"train_s": 0}, {"train_s": -1}, {"collapse_steps": 2.5}, {"warmup_s": True},
                {"poll_s": float("nan")}):
        with pytest.raises(ContractError):
            Thresholds.from_user(bad)


def test_budget_merges_the_class_table_and_checks_names_when_asked():
    b = Budget.from_user({"per_class": {"oom": 1}, "total": 4, "scale": 0.5, "extra": 1})
    assert b.per_class["oom"] == 1 and b.per_class["crash"] == 3 and b.total == 4
    assert Budget.from_user(b.to_json()) == b
    with pytest.raises(ContractError, match="unknown failure class 'bogus'"):
        Budget.from_user({"per_class": {"bogus": 1}}, classes=("oom", "crash"))
    for bad in ({"scale": 0}, {"total": -1}, {"per_class": {"oom": "x"}}):
        with pytest.raises(ContractError):
            Budget.from_user(bad)


def test_the_supervisor_refuses_a_spec_of_another_version_and_writes_nothing(tmp_path):
    """A run dir whose spec.json is of another version: one line, exit 0 (no restart loop),
    and no state.json or events.jsonl."""
    (tmp_path / "spec.json").write_text(json.dumps({"version": 1, "run_id": "old-1"}))
    p = subprocess.run([sys.executable, "-m", "orchestrator.supervisor", "--run-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "version 1 is not one this supervisor reads" in lines[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["spec.json"]
