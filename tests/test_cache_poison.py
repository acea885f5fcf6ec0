"""A compile killed mid-write must not poison the run's kept compile cache: before a restart
the supervisor drops empty and cut-short shared objects from ``runs/<id>/cache``, and an
attempt that died at start-up loading a shared object from it gets a clean cache. Pure
judgements, and real supervisor runs of a command that loads a real extension module from the
cache the way inductor loads its ``main.so`` (a real ImportError, a real SIGKILL)."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.errors import RunFailed
from orchestrator.ops.cache_check import bad_artifact, cache_import_error
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
