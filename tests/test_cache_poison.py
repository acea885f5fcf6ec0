"""A compile killed mid-write must not poison the run's kept compile cache: before a restart
the supervisor drops empty and cut-short shared objects from ``runs/<id>/cache``, and an
attempt that died at start-up loading a shared object from it gets a clean cache. Pure
judgements, and real supervisor runs of a command that loads a real extension module from the
cache the way inductor loads its ``main.so`` (a real ImportError, a real SIGKILL)."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

import pytest

from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.common.errors import RunFailed
from orchestrator.supervisor.policy.cache_check import bad_artifact, cache_import_error
from orchestrator.supervisor import cache_scrub
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import FAST, events, local_host, make_root, wait_final


def test_what_cannot_be_kept():
    assert bad_artifact("main.so", 0, b"") == "empty"
    assert bad_artifact("c.py", 0, b"") == "empty"
    assert bad_artifact("main.so", 40, b"\x7fELF") == "a shared object of 40 bytes (cut short)"
    assert bad_artifact("main.so", 4096, b"#!/b") == "not an ELF shared object"
    assert bad_artifact("main.so", 4096, b"\x7fELF") is None
    assert bad_artifact("c.py", 10, b"impo") is None
    assert bad_artifact("c3kf.lock", 0, b"") is None     # inductor's locks are empty


def test_an_import_error_counts_only_from_the_runs_cache():
    line = ("torch._inductor.exc.InductorError: ImportError: /r/runs/x/cache/inductor/ab/"
            "main.so: file too short")
    assert cache_import_error(["x", line], "/r/runs/x/cache") == line
    assert cache_import_error([line], "/r/runs/y/cache") is None
    assert cache_import_error(["ImportError: No module named 'foo'"], "/r/runs/x/cache") is None


def test_scrub_on_a_real_tree(tmp_path):
    c = tmp_path / "cache"
    (c / "inductor" / "ab").mkdir(parents=True)
    (c / "inductor" / "ab" / "main.so").write_bytes(b"")
    (c / "inductor" / "ab" / "k.py").write_text("x = 1\n")
    real = next(p for p in map(__import__("pathlib").Path, sys.path)
                if p.is_dir() and list(p.glob("_*.cpython-*.so")))
    good = next(real.glob("_*.cpython-*.so"))
    (c / "inductor" / "good.so").write_bytes(good.read_bytes())
    dropped = cache_scrub.scrub(str(c))
    assert dropped == [("inductor/ab/main.so", "empty")]
    assert (c / "inductor" / "good.so").exists() and (c / "inductor" / "ab" / "k.py").exists()


# A command that loads ``cache/inductor/ab/mod.so`` as an extension module, as inductor loads
# its compiled main.so. With none there it "compiles" one (copies a real extension module in
# place, not by rename) and trains; attempt 1 is killed with SIGKILL mid-write.
TRAINER = textwrap.dedent("""
    import importlib.machinery, importlib.util, os, shutil, signal, sys
    cache = os.path.join(os.environ["DFO_RUN_DIR"], "cache", "inductor", "ab")
    os.makedirs(cache, exist_ok=True)
    so = os.path.join(cache, "mod.so")
    attempt = int(os.environ["DFO_ATTEMPT"])
    if os.path.exists(so):
        spec = importlib.util.spec_from_file_location("mod", so)
        importlib.util.module_from_spec(spec)       # ImportError when it is not loadable
    else:
        real = importlib.machinery.PathFinder.find_spec("_json").origin
        with open(real, "rb") as src, open(so, "wb") as dst:
            data = src.read()
            dst.write(data[:int(sys.argv[1])] if attempt == 1 else data)
            dst.flush()
            if attempt == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # killed while it wrote the .so
    for i in range(1, 4):
        print(f"step {i} loss 1.0 tok/s 10", flush=True)
""")


def _launch(run_ops, cmd, name, tmp):
    rf = tmp / f"{name}.yaml"
    rf.write_text('step_pattern: "step (?P<step>\\\\d+) loss \\\\S+ tok/s (?P<tok_s>[\\\\d.]+)"\n')
    try:
        return run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name=name,
                                        backoff_scale=0.01, thresholds=dict(FAST),
                                        env_check=False)).run_id
    except RunFailed as e:
        return re.search(r"run (\S+) failed at start", str(e)).group(1)


@pytest.fixture
def setup(tmp_path):
    root = make_root(tmp_path)
    return root, RunOps(LocalTransport("local"), local_host(root)), tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("cut, expect", [
    (0, "dropped 1 file(s)"),                  # an empty .so: dropped before the restart
    (200, "the run's cache cleared"),          # cut short but ELF: cleared after the import
])
def test_a_compile_killed_mid_write_does_not_poison_the_restart(setup, cut, expect):
    root, run_ops, tmp = setup
    script = tmp / "trainer.py"
    script.write_text(TRAINER)
    run_id = _launch(run_ops, [sys.executable, str(script), str(cut)], f"poison{cut}", tmp)
    info = wait_final(run_ops, run_id, timeout=180)
    evs = events(root, run_id)
    notes = [e.detail for e in evs if e.kind == "cache_restore"]
    assert info["status"] == "done", (info.get("reason"), notes)
    assert any(expect in d for d in notes), notes
    assert "mod.so" in " ".join(notes)


# A command that loads ``cache/inductor/ab/mod.so`` as an extension module (as inductor loads
# its main.so); with none there it "compiles" one (a real extension module) and trains.
LOADER = textwrap.dedent("""
    import importlib.machinery, importlib.util, os, shutil
    cache = os.path.join(os.environ["DFO_RUN_DIR"], "cache", "inductor", "ab")
    os.makedirs(cache, exist_ok=True)
    so = os.path.join(cache, "mod.so")
    real = importlib.machinery.PathFinder.find_spec("_json").origin
    if os.path.exists(so):
        spec = importlib.util.spec_from_file_location("_json", so)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))   # ImportError
    else:
        shutil.copyfile(real, so)
    for i in range(1, 4):
        print(f"step {i} loss 1.0 tok/s 10", flush=True)
""")


def _own_run_with_live_cache(tmp, root, name, live_files):
    """A run of LOADER whose spec seeds (and restores) its cache from a live cache of the
    host holding ``live_files`` (relative path -> bytes): the real seed script."""
    import json
    import time as _time

    from dfo_contract.runspec import Cache, Config, Identity, Own, Resume, RunSpec
    from orchestrator.common.budget import BudgetPolicy
    from orchestrator.common.fallback import merge_ladders
    from orchestrator.config.host_tree import HostTree
    from orchestrator.plan.run_identity import make_run_id
    from orchestrator.plan.snapshot import paths, seed_run_cache_argvs
    from orchestrator.plan.thresholds import thresholds as thresholds_of

    tree = HostTree(str(root))
    live = paths(tree, "k1").live
    for rel, data in live_files.items():
        p = os.path.join(live, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    run_id = make_run_id(name, _time.time())
    run_dir = tree.run_dir(run_id)
    os.makedirs(run_dir)
    script = tmp / f"{name}.py"
    script.write_text(LOADER)
    spec = RunSpec(
        identity=Identity(run_id=run_id, run_name=name, host="local", root=str(root),
                          python=sys.executable, lock=tree.run_lock),
        config=Config(path=os.path.join(run_dir, "run-file.yaml")),
        resume=Resume(checkpoint_dir=run_dir),
        thresholds=thresholds_of(dict(FAST)), budget=BudgetPolicy(scale=0.01),
        ladders={k: tuple(v) for k, v in merge_ladders().items()},
        cache=Cache(key="k1", restore_argv=tuple(seed_run_cache_argvs(tree, "k1", run_dir)[-1])),
        trainer=Own(command=(sys.executable, str(script)),
                    step_pattern=r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"))
    with open(os.path.join(run_dir, "spec.json"), "w") as f:
        json.dump(spec.to_json(), f)
    return run_id, run_dir


def _real_so() -> bytes:
    import importlib.machinery

    with open(importlib.machinery.PathFinder.find_spec("_json").origin, "rb") as f:
        return f.read()


@pytest.mark.parametrize("broken, why", [
    (b"", "empty"),                                   # judged by its size alone
    (None, "attempt 1 failed to load it"),            # a whole ELF header, cut short after
])
def test_a_broken_file_in_the_hosts_live_cache_never_reaches_an_attempt_twice(
        setup, broken, why):
    import subprocess

    from orchestrator.common.launch_argv import supervisor_argv
    from tests.supervisor_env import REPO

    root, run_ops, tmp = setup
    data = broken if broken is not None else _real_so()[:200]
    run_id, run_dir = _own_run_with_live_cache(tmp, root, "livepoison",
                                               {"inductor/ab/mod.so": data})
    p = subprocess.run(supervisor_argv(sys.executable, run_dir), capture_output=True,
                       text=True, timeout=120, cwd=str(tmp),
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    evs = events(root, run_id)
    notes = [e.detail for e in evs if e.kind == "cache_restore"]
    final = evs[-1]
    assert final.kind == "final" and final.status == "done", (final, notes)
    said = " ".join(notes)
    assert "the host's live cache holds 1 file(s) that cannot be loaded" in said, notes
    assert f"inductor/ab/mod.so ({why})" in said and "dfo warm-cache" in said, notes
    assert not any("clean cache" in d for d in notes), notes
    # the live cache is the operator's to repair: the supervisor only leaves it out
    assert (root / "cache").exists()


def test_a_run_that_keeps_failing_to_load_from_its_cache_says_so_whole_and_names_the_repair(
        setup):
    root, run_ops, tmp = setup
    script = tmp / "bad.py"   # "compiles" a cut-short shared object each attempt and loads it
    script.write_text(textwrap.dedent("""
        import importlib.machinery, importlib.util, os
        cache = os.path.join(os.environ["DFO_RUN_DIR"], "cache", "inductor", "ab")
        os.makedirs(cache, exist_ok=True)
        so = os.path.join(cache, "mod.so")
        with open(importlib.machinery.PathFinder.find_spec("_json").origin, "rb") as f:
            data = f.read()[:200]
        with open(so, "wb") as f:
            f.write(data)
        spec = importlib.util.spec_from_file_location("_json", so)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    """))
    run_id = _launch(run_ops, [sys.executable, str(script)], "cutso", tmp)
    info = wait_final(run_ops, run_id, timeout=120)
    assert info["status"] == "failed", info
    reason = info["reason"]
    assert f"/runs/{run_id}/cache/inductor/ab/mod.so: " in reason, reason
    assert "`dfo warm-cache` repairs it" in reason, reason


def test_warm_cache_status_shows_a_damaged_live_cache_and_its_scrub_drops_it(
        setup, tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.engine.compile_cache import CacheManager
    from orchestrator.config.host_tree import HostTree
    from orchestrator.plan.snapshot import paths

    root, _run_ops, _tmp = setup
    live = paths(HostTree(str(root)), "cpu-k1").live
    os.makedirs(os.path.join(live, "inductor", "ab"))
    with open(os.path.join(live, "inductor", "ab", "main.so"), "wb"):
        pass                                             # 0 bytes: a compile cut off
    good = os.path.join(live, "inductor", "ab", "k.py")
    with open(good, "w") as f:
        f.write("x = 1\n")
    os.makedirs(os.path.join(live, "inductor", "locks"))
    with open(os.path.join(live, "inductor", "locks", "c3kf.lock"), "wb"):
        pass                                             # empty by design: not damage
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: h\nhosts:\n  h: {{transport: local, root: {root}}}\n")
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--status"]) == 8
    out = capsys.readouterr()
    assert "DAMAGED" in out.out and "inductor/ab/main.so (empty)" in out.out, out.out
    assert "live compile cache(s) on h are damaged" in out.err, out.err
    assert "dfo warm-cache" in out.err
    assert main(["--hosts", str(hosts), "warm-cache", "--status", "--json"]) == 8
    keys = json.loads(capsys.readouterr().out)["keys"]
    assert keys[0]["live_damage"] == [["inductor/ab/main.so", "empty"]], keys
    mgr = CacheManager(LocalTransport(), HostTree(str(root)), host="h")
    assert mgr.scrub_live("cpu-k1") == [("inductor/ab/main.so", "empty")]
    assert os.path.exists(good) and not os.path.exists(os.path.join(live, "inductor", "ab",
                                                                    "main.so"))
    assert main(["--hosts", str(hosts), "warm-cache", "--status"]) == 0


def test_empty_lock_files_are_kept_by_the_scrub(tmp_path):
    """torch and triton take empty lock files (filelock): they are no damage, and a scrub
    that dropped them told of each one after every failed attempt."""
    assert bad_artifact("ab.lock", 0, b"") is None
    inductor = tmp_path / "inductor" / "locks"
    inductor.mkdir(parents=True)
    (inductor / "ab.lock").write_bytes(b"")
    (inductor / "main.so").write_bytes(b"")
    assert cache_scrub.scrub(str(tmp_path)) == [("inductor/locks/main.so", "empty")]
    assert (inductor / "ab.lock").exists()
