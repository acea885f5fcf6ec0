"""The standby interpreter (docs/recovery.md, "Standby interpreter"): the pure decisions of
orchestrator/supervisor/policy/standby.py, the shim's ``--standby`` mode as a real process, and real
supervisor runs on CPU (tiny config, torch.compile on, threads layout with two drafters)
where attempt 1 fails with torch's FX error and attempt 2 is served by the standby."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.supervisor.policy import standby as sb
from dfo_contract import events as ev

from tests.supervisor_env import (FAST, events, kinds, local_host, make_root, wait_final,
                                  write_config)

REPO = Path(__file__).resolve().parents[1]
PY = "/env/bin/python"
ARGV = [PY, "-m", "orchestrator.supervisor.shim", "trainer", "train", "--config", "c.yaml"]


# --- pure decisions -----------------------------------------------------------------------

def test_import_env_keys_and_differences():
    env = {"PATH": "/bin", "TORCHINDUCTOR_CACHE_DIR": "/c", "PYTHONPATH": "/p", "LD_LIBRARY_PATH":
           "/l", "OMP_NUM_THREADS": "2", "HF_HOME": "/h", "DFO_ATTEMPT": "2", "HOME": "/root",
           "CUDA_VISIBLE_DEVICES": "0", "TRANSFORMERS_OFFLINE": "1", "NCCL_NVLS_ENABLE": "0"}
    got = sb.import_env(env)
    assert "DFO_ATTEMPT" not in got and "HOME" not in got
    assert set(got) == set(env) - {"DFO_ATTEMPT", "HOME"}
    # DFO_* (the attempt number) may differ; an import-time key may not, nor one side only
    assert sb.env_differences(env, {**env, "DFO_ATTEMPT": "3", "HOME": "/x"}) == []
    assert sb.env_differences(env, {**env, "OMP_NUM_THREADS": "4"}) == ["OMP_NUM_THREADS"]
    less = dict(env)
    del less["HF_HOME"]
    assert sb.env_differences(env, {**less, "TRITON_CACHE_DIR": "/t"}) == \
        ["HF_HOME", "TRITON_CACHE_DIR"]


def test_only_the_bundled_trainer_in_one_process_is_eligible():
    assert sb.ineligible(ARGV, own=False, group=False, layout="threads") is None
    assert sb.ineligible(ARGV, own=False, group=False, layout=None) is None
    assert "ddp" in sb.ineligible(ARGV, own=False, group=False, layout="ddp")
    assert "own trainer" in sb.ineligible(ARGV, own=True, group=False, layout="single")
    assert "multi-node" in sb.ineligible(ARGV, own=False, group=True, layout="single")
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                "-m", "orchestrator.supervisor.shim", "trainer", "train"]
    assert "shim" in sb.ineligible(torchrun, own=False, group=False, layout="single")


def _ready(**kw):
    d = dict(pid=1, python=PY, env={"PATH": "/bin", "DFO_ATTEMPT": "2"}, started_at=0.0,
             ready=True)
    d.update(kw)
    return sb.StandbyProcess(**d)


def test_decide_uses_only_a_ready_matching_standby():
    env = {"PATH": "/bin", "DFO_ATTEMPT": "2"}
    assert sb.decide(None, python=PY, env=env, argv=ARGV, why_not=None) == sb.Use(False, "none")
    assert sb.decide(_ready(), python=PY, env=env, argv=ARGV, why_not=None).use
    d = sb.decide(_ready(ready=False), python=PY, env=env, argv=ARGV, why_not=None)
    assert not d.use and "not ready" in d.reason           # never waited for by default
    d = sb.decide(_ready(alive=False), python=PY, env=env, argv=ARGV, why_not=None)
    assert not d.use and "died" in d.reason
    d = sb.decide(_ready(), python=PY, env={"PATH": "/usr/bin"}, argv=ARGV, why_not=None)
    assert not d.use and d.reason == "env differs: PATH"
    d = sb.decide(_ready(python="/other/python"), python=PY, env=env, argv=ARGV, why_not=None)
    assert not d.use and "python differs" in d.reason
    d = sb.decide(_ready(), python=PY, env=env, argv=ARGV, why_not="layout ddp")
    assert not d.use and "layout ddp" in d.reason


def test_preload_request_ready_and_argv_round_trip():
    from dfo_contract import trainer_config as tcfg

    p = sb.preload_for(tcfg.set_values(tcfg.TrainerConfig(), {
        "model.target_path": "/t", "compile.enabled": False, "parallel.layout": "threads"}))
    assert p == sb.Preload("/t", False, "threads")
    assert sb.preload_for(tcfg.TrainerConfig()) == sb.Preload(None, True, "single")
    argv = sb.standby_argv(PY, 7, p)
    assert argv[:5] == [PY, "-m", "orchestrator.supervisor.shim", "--standby", "--ready-fd"]
    assert sb.Preload.from_json(json.loads(argv[argv.index("--preload") + 1])) == p
    req = sb.Request(ARGV, {"A": "1"}, "/run", "/run/attempt-2.log")
    back = sb.Request.from_line(req.to_line())
    assert back == req
    assert back.module_argv() == ("trainer", ["trainer", "train", "--config", "c.yaml"])
    with pytest.raises(ValueError):
        sb.Request([PY, "-m", "torch.distributed.run"], {}, "/", "/l").module_argv()
    r = sb.Ready.from_line(sb.Ready(1.23456, ["torch"], True).to_line())
    assert r.import_s == 1.235 and r.modules == ["torch"] and r.niced and r.error is None


def test_priority_is_lowered_only_where_it_can_be_restored():
    cap = 1 << sb.CAP_SYS_NICE
    assert sb.can_restore_priority(euid=0, cap_eff=0, nice_now=0, rlimit_nice_hard=0)
    assert sb.can_restore_priority(euid=1000, cap_eff=cap, nice_now=0, rlimit_nice_hard=0)
    assert not sb.can_restore_priority(euid=1000, cap_eff=0, nice_now=0, rlimit_nice_hard=0)
    assert sb.can_restore_priority(euid=1000, cap_eff=0, nice_now=0, rlimit_nice_hard=20)
    assert sb.can_restore_priority(euid=1000, cap_eff=0, nice_now=5, rlimit_nice_hard=15)
    assert sb.can_restore_priority(euid=1000, cap_eff=0, nice_now=0, rlimit_nice_hard=-1)


def test_events_read_as_one_line():
    for k in ("standby_start", "standby_ready", "standby_used", "standby_discarded"):
        assert ev.REGISTRY[k].kind == k                     # known kinds (events.jsonl)
    assert "ready after 4.2s" in ev.StandbyReady(pid=1, import_s=4.2, modules=3, niced=False,
                                                 error=None).describe()
    assert "attempt 2 runs in the standby" in ev.StandbyUsed(
        attempt=2, pid=9, import_s=4.2, age_s=1.0, log="attempt-2.log").describe()
    assert "env differs: PATH" in ev.StandbyDiscarded(
        attempt=2, pid=9, reason="env differs: PATH").describe()


def test_preload_lists_the_targets_modeling_module(tmp_path):
    from trainer.preload import modules_for, target_modeling_module

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert target_modeling_module(str(tmp_path)) == "transformers.models.qwen3.modeling_qwen3"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "../../evil"}))
    assert target_modeling_module(str(tmp_path)) is None
    assert target_modeling_module(None) is None
    mods = modules_for(target_path=None, compile=True, layout="threads")
    assert mods[0] == "torch" and "torch._inductor.compile_fx" in mods
    assert "trainer.parallel.threads" in mods
    assert "torch._inductor.compile_fx" not in modules_for(target_path=None, compile=False,
                                                           layout="single")


def test_no_standby_reaches_the_spec(tmp_path, capsys, tiny_assets):  # noqa: F811
    """`dfo launch --no-standby` turns it off in spec.json (default on)."""
    from orchestrator.cli import main
    from tests.supervisor_env import hosts_yaml

    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    got = []
    for extra in ([], ["--no-standby"]):
        rc = main(["--hosts", str(hosts), "launch", "--config", str(cfg), "--dry-run", "--json",
                   "--no-env-check", *extra])
        out = capsys.readouterr()
        assert rc == 0, out.err
        got.append(json.loads(out.out)["standby"])
    assert got == [True, False]


def _spec(standby: bool = True, own: dict | None = None, group: bool = False):
    """A RunSpec with the fields the Keeper reads (standby on/off, an own command, one
    node of a group)."""
    from dfo_contract.runspec import (Bundled, Config, Group, Identity, Own, Resume, RunSpec,
                                      Solo, Standby)

    role = Group(name="g", nodes=("a", "b"), node=0, head_addr="127.0.0.1", port=29500,
                 coord_port=29501, nproc=1) if group else Solo()
    return RunSpec(identity=Identity(run_id="r-1", run_name="r", host="local", root="/r",
                                     python=sys.executable, lock="/r/locks/run.lock"),
                   config=Config(path="/r/runs/r-1/config.yaml"),
                   resume=Resume(checkpoint_dir="/r/checkpoints/r"),
                   standby=Standby(enabled=standby),
                   trainer=Own(command=tuple(own["command"])) if own else Bundled(),
                   role=role)


def _inputs(**kw):
    """The Keeper's inputs as the supervisor builds them for this spec: its attempt source
    says whether the trainer is an own command, its role whether it is one node of
    several."""
    from dfo_contract.runstate import RunState
    from orchestrator.supervisor.core import role_for
    from orchestrator.supervisor.record import RunRecord, Stop
    from orchestrator.supervisor.source import source_for
    from orchestrator.supervisor.standby import KeeperInputs

    spec = _spec(**kw)
    run_dir = "/r/runs/r-1"
    record = RunRecord(run_dir, RunState.new("r-1", "r", now=0.0))
    source = source_for(spec, run_dir, record.emit)
    role = role_for(spec, run_dir, record, Stop())
    return KeeperInputs(run_dir=run_dir, python=spec.identity.python, spec=spec.standby,
                        thresholds=spec.thresholds,
                        config=lambda: source.config(record.state.overrides),
                        bundled=lambda: source.bundled(record.state.overrides),
                        attempt_env=source.attempt_env, emit=record.emit,
                        started=record.standby_started, gone=record.standby_gone,
                        own=source.own, group=role.multinode)


def test_keeper_is_off_for_no_standby_own_and_groups():
    from orchestrator.supervisor.standby import Keeper

    assert Keeper(_inputs()).enabled() and Keeper(_inputs(standby=True)).enabled()
    assert not Keeper(_inputs(standby=False)).enabled()
    assert not Keeper(_inputs(own={"command": ["x"]})).enabled()
    assert not Keeper(_inputs(group=True)).enabled()


# --- the shim's standby mode, a real process ------------------------------------------------

def test_standby_process_imports_reports_ready_then_runs_the_module(tmp_path):
    """Real interpreter: it preloads, says ready on its fd, then runs the module it is given
    with the request's argv, env, cwd and log (the way the shim would)."""
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "sbprobe.py").write_text(
        "import os, sys, json\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'x': os.environ.get('X'),"
        " 'loaded': 'torch' in sys.modules, 'stdin': sys.stdin.read()}))\n"
        "sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{mod}", PYTHONUNBUFFERED="1")
    r, w = os.pipe()
    argv = sb.standby_argv(sys.executable, w, sb.Preload(None, False, "single"))
    with open(tmp_path / "standby.log", "ab") as logf:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=logf, stderr=logf, env=env,
                             cwd=str(tmp_path), pass_fds=(w,))
    os.close(w)
    with os.fdopen(r, "rb") as f:
        ready = sb.Ready.from_line(f.readline())
    assert ready.error is None and "torch" in ready.modules and "trainer.train.loop" in ready.modules
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "attempt-2.log"
    req = sb.Request([sys.executable, "-m", "orchestrator.supervisor.shim", "sbprobe", "a", "b"],
                     {**env, "X": "attempt-env"}, str(work), str(log))
    p.stdin.write(req.to_line())
    p.stdin.close()
    assert p.wait(timeout=120) == 3
    got = json.loads(log.read_text().strip().splitlines()[-1])
    assert got == {"argv": ["a", "b"], "cwd": str(work), "x": "attempt-env", "loaded": True,
                   "stdin": ""}


def test_standby_exits_when_its_stdin_closes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r, w = os.pipe()
    argv = sb.standby_argv(sys.executable, w, sb.Preload(None, False, "single"))
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env, cwd=str(tmp_path), pass_fds=(w,))
    os.close(w)
    with os.fdopen(r, "rb") as f:
        f.readline()
    p.stdin.close()
    assert p.wait(timeout=60) == 0


# --- real supervisor runs --------------------------------------------------------------------

def _launch(tmp_path, assets, thresholds=(), **kw):
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport

    root = make_root(tmp_path)
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cfg = write_config(tmp_path / "c.yaml", assets, train={"max_steps": 10})
    sets = ("compile.enabled=true", "compile.gate=false", "parallel.layout=threads",
            "parallel.drafter_devices=[cpu,cpu]")
    o = LaunchOptions(config=str(cfg), run_name="sb", fault="fx_race@3", backoff_scale=0.01,
                      sets=sets, thresholds=dict(FAST, warmup_s=300, standby_wait_s=300,
                                                 **dict(thresholds)),
                      env_check=False, **kw)
    plan = run_ops.launch(o)
    info = wait_final(run_ops, plan.run_id, timeout=600)
    return root, plan.run_id, info, events(root, plan.run_id)


@pytest.mark.slow
def test_attempt_two_runs_in_the_standby(tmp_path, tiny_assets):  # noqa: F811
    # standby_early_cpus 1: started with attempt 1, as on a GPU node (the 2-core default
    # waits for training: the other test below)
    root, run_id, info, evs = _launch(tmp_path, tiny_assets,
                                      thresholds={"standby_early_cpus": 1})
    assert info["status"] == "done", info.get("reason")
    from dfo_contract.markers import iter_markers

    log1 = (root / "runs" / run_id / "attempt-1.log").read_text().splitlines()
    first_step = next(m["t"] for m in iter_markers(log1) if m["kind"] == "step")
    assert kinds(evs, "standby_start")[0].t < first_step
    assert kinds(evs, "classified")[0].cls == "fx_trace_race"
    ready = kinds(evs, "standby_ready")
    assert ready and ready[0].error is None and ready[0].import_s > 0
    used = kinds(evs, "standby_used")
    assert [u.attempt for u in used] == [2]
    starts = kinds(evs, "attempt_start")
    assert starts[1].pid == used[0].pid == ready[0].pid
    assert "--compile.gate=true" in starts[1].argv
    # attempt 2 (the standby) wrote its output into its own log and finished the run
    log2 = (root / "runs" / run_id / "attempt-2.log").read_text()
    assert '"kind": "done"' in log2
    # attempt 2 trained, so a standby for attempt 3 was started; the end of the run killed it
    assert kinds(evs, "standby_discarded")[-1].reason.startswith("the run ended")
    state = json.loads((root / "runs" / run_id / "state.json").read_text())
    assert state["standby_pid"] is None


@pytest.mark.slow
def test_a_differing_import_time_env_key_discards_the_standby(tmp_path, tiny_assets):  # noqa: F811
    root, run_id, info, evs = _launch(tmp_path, tiny_assets,
                                      standby_env={"OMP_NUM_THREADS": "7"})
    assert info["status"] == "done", info.get("reason")
    log1 = (root / "runs" / run_id / "attempt-1.log").read_text().splitlines()
    from dfo_contract.markers import iter_markers

    train_t = next(m["t"] for m in iter_markers(log1) if m.get("phase") == "train")
    assert kinds(evs, "standby_start")[0].t >= train_t  # 2 cores: after training began
    assert not kinds(evs, "standby_used")
    d = kinds(evs, "standby_discarded")
    assert d[0].attempt == 2 and d[0].reason == "env differs: OMP_NUM_THREADS"
    starts = kinds(evs, "attempt_start")
    assert len(starts) == 2 and starts[1].pid != d[0].pid


def test_standby_starts_with_the_attempt_only_on_a_host_with_enough_cpus():
    assert sb.start_with_attempt(16, 8) and sb.start_with_attempt(8, 8)
    assert not sb.start_with_attempt(2, 8)      # CI's 2 cores: once training began
    assert not sb.start_with_attempt(64, 0)     # 0: never early
    assert not sb.start_with_attempt(None, 8)


def test_a_standby_slows_the_attempt_only_while_it_imports():
    s = sb.StandbyProcess(pid=1, python=PY, env={}, started_at=1000.0)
    assert sb.importing(s, 1010.0)                   # the throughput monitor pauses
    s.ready = True
    assert not sb.importing(s, 1010.0)
    dead = sb.StandbyProcess(pid=1, python=PY, env={}, started_at=1000.0, alive=False)
    assert not sb.importing(dead, 1010.0) and not sb.importing(None, 1010.0)
    # an import stuck far longer than any real one uses no CPU: collapse detection resumes
    assert not sb.importing(sb.StandbyProcess(pid=1, python=PY, env={}, started_at=1000.0),
                            1000.0 + sb.IMPORT_PAUSE_MAX_S)


def test_a_standby_of_an_env_deploy_replaced_is_not_used(tmp_path):
    """dfo deploy swaps envs/current to a new generation: the standby holds the old one's
    modules, so the attempt starts fresh on the new env."""
    from orchestrator.supervisor.standby import _env_dir

    for gen in ("gen-a", "gen-b"):
        (tmp_path / gen / "bin").mkdir(parents=True)
        (tmp_path / gen / "bin" / "python").symlink_to(sys.executable)
    cur = tmp_path / "current"
    cur.symlink_to(tmp_path / "gen-a")
    py = str(cur / "bin" / "python")
    started = _env_dir(py)
    assert started == str((tmp_path / "gen-a" / "bin").resolve())
    env = {"PATH": "/bin"}
    standby = sb.StandbyProcess(pid=1, python=py, env=env, started_at=0.0, ready=True, env_dir=started)
    argv = [py, *ARGV[1:]]
    assert sb.decide(standby, python=py, env=env, argv=argv, why_not=None,
                     env_dir=_env_dir(py)).use
    cur.unlink()
    cur.symlink_to(tmp_path / "gen-b")                # the swap
    d = sb.decide(standby, python=py, env=env, argv=argv, why_not=None, env_dir=_env_dir(py))
    assert not d.use and d.reason.startswith("the env was replaced since it started")
