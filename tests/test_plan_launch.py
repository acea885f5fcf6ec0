"""The one launch planner (plan.launch_inputs.prepare, plan.launch_plan.facts_request and
plan_launch), pure: the host's facts are given as the facts probe would have answered them.
Bundled and own trainers, alone and as a group's nodes."""

from __future__ import annotations

import json

import pytest

from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.replies import EnvFacts, LaunchProbeReply
from dfo_contract.runspec import Group, Own, ResumeChoice, RunSpec
from orchestrator.config.hostconfig import HostConfig
from orchestrator.common.errors import ConfigError, LockHeldError, NotFoundError
from orchestrator.plan import cache_key as ck
from orchestrator.plan import launch_plan as lp
from dfo_contract import trainer_config as tcfg
from orchestrator.config.runconfig import with_overrides
from orchestrator.plan import launch_inputs as lr
from orchestrator.plan.launch_facts import LaunchFacts
from orchestrator.plan.launch_own import own_config

HOST = HostConfig(name="lab", transport="local", root="/root/dfo", source="test")
NOW = 1_764_000_000.0
FULL = {"model": {"target_path": "/m/target", "attention": "sdpa"},
        "data": {"path": "/d/data.jsonl"}, "train": {"micro_batch": 8},
        "parallel": {"layout": "single", "drafter_devices": ["cpu"]},
        "compile": {"enabled": True}}
FP = {"profile": "cpu", "lock_hash": "h", "python": "3.11.2", "torch": "2.13.0+cpu",
      "devices": [], "cuda_available": False}
SRC = {"trainer/train/loop.py": "a" * 64}


def ckpt(step, valid=True, reason="", run=None):
    return {"name": f"step_{step}", "step": step, "valid": valid, "reason": reason, "run": run,
            "path": f"/root/dfo/checkpoints/r/step_{step}"}


def facts(*, lock="free", owner="", ckpts=(), missing=(), caches=(), systemd="1", **py):
    p = {"fingerprint": FP, "source": SRC, "hashes": {"/m/target/config.json": "c" * 64},
         "checkpoints": {"/root/dfo/checkpoints/r": list(ckpts)}, "caches": list(caches)}
    p.update(py)
    return LaunchFacts(launch=LaunchProbeReply(systemd=systemd, env="1", lock=lock,
                                               lock_owner=owner),
                       missing=list(missing), py=EnvFacts.from_json(p), complete=True)


def inputs(o, full=FULL, sets=None):
    layers = with_overrides(tcfg.config_from_dict(full), b"model: {}\n", sets or [])
    return lr.prepare(o, lr.BundledConfig(source="/c/r.yaml", name="r", layers=layers), HOST, NOW)


def plan(o=None, f=None, **kw):
    o = o or lr.LaunchOptions(config="/c/r.yaml")
    return lp.plan_launch(o, inputs(o), f or facts(), host=HOST, **kw)


def test_a_bundled_plan_is_one_runspec_with_its_host_steps():
    o = lr.LaunchOptions(config="/c/r.yaml", fault="oom@3", thresholds={"train_s": 8})
    p = plan(o)
    s = p.spec
    assert RunSpec.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert s.identity.run_id.startswith("r-20251124-") and s.identity.host == "lab"
    assert s.config.path == f"/root/dfo/runs/{s.run_id}/config.yaml"
    assert s.config.base["train.micro_batch"] == 8 and s.trainer.fault == "oom@3"
    assert s.thresholds.train_s == 8.0 and s.thresholds.warmup_s == 900.0
    assert s.resume.checkpoint_dir == "/root/dfo/checkpoints/r" and s.resume.path is None
    key = ck.compute_key(EnvFingerprint.from_json(FP), tcfg.config_from_dict(FULL).to_dict(), trainer_source=ck.source_hash(SRC),
                         target_config="c" * 64).key
    assert s.cache.key == key and s.cache.env["DFO_CACHE_KEY"] == key
    assert s.cache.restore_argv == tuple(p.seed_argvs[-1])
    assert p.mode == "systemd" and p.start_argv[0] == "systemd-run"
    assert any(f"no warm compile cache for key {key}" in w for w in p.warnings)
    assert not [w for w in plan(f=facts(caches=[key])).warnings if "compile cache" in w]
    assert p.env["DFO_FAULT"] == "oom@3" and p.record is None


def test_what_is_asked_follows_the_config():
    o = lr.LaunchOptions(config="/c/r.yaml", resume="/root/dfo/checkpoints/old/step_3",
                         dry_run=True)
    req = lp.facts_request(o, inputs(o), HOST)
    assert req.paths == ("/m/target", "/d/data.jsonl") and not req.promote
    assert req.ckpt_dirs == ("/root/dfo/checkpoints/r", "/root/dfo/checkpoints/old")
    assert req.source and req.hashes == ("/m/target/config.json",) and req.caches
    cold = {**FULL, "compile": {"enabled": False}}
    o2 = lr.LaunchOptions(config="/c/r.yaml")
    req = lp.facts_request(o2, inputs(o2, cold), HOST)
    assert not req.source and req.hashes == () and req.caches == "" and req.promote


def test_lock_then_paths_then_checkpoints_each_with_its_error():
    with pytest.raises(LockHeldError, match="run other-1 is live on lab"):
        plan(f=facts(lock="held", owner="other-1", missing=["/d/data.jsonl"]))
    with pytest.raises(ConfigError, match="data.path of /c/r.yaml: /d/data.jsonl does not exist"):
        plan(f=facts(missing=["/d/data.jsonl"]))
    with pytest.raises(ConfigError, match=r"already holds 2 checkpoint\(s\).*newest step_8"):
        plan(f=facts(ckpts=[ckpt(8), ckpt(2)]))
    p = plan(lr.LaunchOptions(config="/c/r.yaml", new_lineage=True),
             facts(ckpts=[ckpt(8), ckpt(2)]))
    assert p.move_aside == "/root/dfo/checkpoints/r.20251124-160000"
    p = plan(lr.LaunchOptions(config="/c/r.yaml", replace=True),
             facts(lock="held", owner="other-1"))
    assert p.lock_owner == "other-1"


def test_resume_is_resolved_from_the_manifest_listing():
    lst = [ckpt(4), ckpt(8, valid=False, reason="manifest.json missing"), ckpt(6)]
    p = plan(lr.LaunchOptions(config="/c/r.yaml", resume="latest"), facts(ckpts=lst))
    assert p.resume_path.endswith("/step_6") and p.first_attempt_argv[-2:] == [
        "--resume", "/root/dfo/checkpoints/r/step_6"]
    assert any("skipping checkpoint step_8 (manifest.json missing)" in w for w in p.warnings)
    with pytest.raises(NotFoundError, match="step_8: checkpoint is incomplete"):
        plan(lr.LaunchOptions(config="/c/r.yaml", resume="step_8"), facts(ckpts=lst))
    with pytest.raises(NotFoundError, match="no such checkpoint.*valid.*: step_4, step_6"):
        plan(lr.LaunchOptions(config="/c/r.yaml", resume="step_9"), facts(ckpts=lst))
    with pytest.raises(ConfigError, match="cannot be combined with --resume"):
        plan(lr.LaunchOptions(config="/c/r.yaml", resume="latest", new_lineage=True))


def test_a_dry_run_carries_no_record_and_a_launch_does():
    f = facts()
    f.record = ("/root/dfo/envs/current/.dfo-verified", b"s 1\n{}\n")
    assert plan(lr.LaunchOptions(config="/c/r.yaml", dry_run=True), f).record is None
    assert plan(lr.LaunchOptions(config="/c/r.yaml"), f).record == f.record


def test_group_nodes_head_resolves_others_take_its_checkpoint_and_the_fault_node():
    gs = [Group(name="pair", nodes=("a", "b"), node=i, head_addr="10.0.0.1", port=29400,
                coord_port=29401, nproc=1) for i in (0, 1)]
    o = lr.LaunchOptions(config="/c/r.yaml", resume="latest", fault="exit=1@2", fault_node=1,
                         run_id="r-1")
    lst = [ckpt(4)]
    head = plan(o, facts(ckpts=lst), role=gs[0])
    peer = plan(o, facts(ckpts=[ckpt(9), ckpt(10)]), role=gs[1], resolved=head.resume)
    assert head.resume_path == peer.resume_path == "/root/dfo/checkpoints/r/step_4"
    assert head.spec.group.is_head and peer.spec.group.node == 1
    assert head.spec.trainer.fault is None and peer.spec.trainer.fault == "exit=1@2"
    assert "--rdzv-id" in peer.first_attempt_argv and "r-1-a1" in peer.first_attempt_argv
    # a peer guards no checkpoints of its own: no lineage refusal there
    plan(lr.LaunchOptions(config="/c/r.yaml", run_id="r-1"), facts(ckpts=[ckpt(2)]),
         role=gs[1], resolved=ResumeChoice.scratch())


def test_an_own_trainer_resumes_from_its_glob_or_an_existing_path():
    o = lr.LaunchOptions(command=("python", "train.py", "--x"), resume="latest",
                         resume_glob="ck/step_*", thresholds={"hang_s": 0})
    cfg = own_config(o, {}, None)
    inp = lr.prepare(o, cfg, HOST, NOW)
    req = lp.facts_request(o, inp, HOST)
    assert req.glob == f"{inp.run_dir}/ck/step_*" and req.ckpt_dirs == () and not req.source
    f = facts(glob=[[f"{inp.run_dir}/ck/step_2", 5.0], [f"{inp.run_dir}/ck/step_10", 1.0]])
    p = lp.plan_launch(o, inp, f, host=HOST)
    assert isinstance(p.spec.trainer, Own)
    assert p.spec.trainer.command == ("python", "train.py", "--x")
    assert p.resume_path.endswith("/ck/step_10") and p.spec.thresholds.hang_s == 0.0
    assert p.first_attempt_argv == ["python", "train.py", "--x", "--resume", p.resume_path]
    assert p.spec.config.path.endswith("/run-file.yaml") and p.seed_argvs == []
    with pytest.raises(NotFoundError, match="nothing matches"):
        lp.plan_launch(o, inp, facts(glob=[]), host=HOST)
    o2 = lr.LaunchOptions(command=("python", "t.py"), resume="/srv/ck/7", resume_glob="ck/*")
    inp2 = lr.prepare(o2, own_config(o2, {}, None), HOST, NOW)
    assert lp.facts_request(o2, inp2, HOST).paths == ("/srv/ck/7",)
    with pytest.raises(NotFoundError, match="no such checkpoint"):
        lp.plan_launch(o2, inp2, facts(missing=["/srv/ck/7"]), host=HOST)
    with pytest.raises(LockHeldError):
        lp.plan_launch(o2, inp2, facts(lock="held", owner="x"), host=HOST)
