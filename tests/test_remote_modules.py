"""The modules that run on a target (orchestrator/remote): their functions called directly,
then each run as a subprocess the way dfo runs it (``python -c SOURCE`` or ``python -m``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from dfo_contract.cache_records import HashDirReply
from dfo_contract.codec import decode
from orchestrator.plan import cache_key as ck
from orchestrator.plan import fingerprint as fpm
from orchestrator.plan import snapshot as sn
from orchestrator.plan.probes import Reply
from orchestrator.remote import cache_tool, env_probe, source_hash

AWK = "fil () &&-@_e — ü 'q'"
REPO = Path(__file__).resolve().parents[1]


def _run(argv, **kw) -> Reply:
    p = subprocess.run(argv, capture_output=True, timeout=300, **kw)
    return Reply(p.returncode, p.stdout, p.stderr)


# ----------------------------------------------------------------- env_probe

def test_env_probe_reports_a_failing_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "trainer", None)  # `import trainer` raises ImportError
    fp = env_probe.probe()
    assert fp["python"].count(".") == 2 and fp["trainer_import"] is False
    assert fp["errors"]["trainer"].startswith("ModuleNotFoundError: import of trainer")


def test_env_probe_as_c_and_as_m():
    for argv in (fpm.probe_argv(sys.executable), [sys.executable, "-m", "orchestrator.remote.env_probe"]):
        r = _run(argv)
        assert r.exit_code == 0, r.stderr
        fp = fpm.env_probe(sys.executable).parse(r)
        assert fp.trainer_import is True and fp.dfo


def test_env_probe_source_is_the_module():
    assert fpm.PROBE_SCRIPT == Path(env_probe.__file__).read_text()


# ----------------------------------------------------------------- cache_tool

def _tree(root: Path) -> None:
    (root / "inductor" / AWK).mkdir(parents=True)
    (root / "inductor" / AWK / "f ü").write_bytes(b"hello")
    (root / "triton").mkdir()
    os.symlink("/etc/passwd", root / "triton" / "l'ink")


def test_cache_tool_functions(tmp_path: Path):
    _tree(tmp_path)
    got = cache_tool.run("hashdir", [str(tmp_path)])
    assert got == {"files": {f"inductor/{AWK}/f ü": {"sha256": hashlib.sha256(b"hello").hexdigest(),
                                                      "size": 5}},
                   "other": ["triton/l'ink"]}
    assert cache_tool.run("hashfile", [str(tmp_path / "nope")]) == {"missing": True}
    assert cache_tool.run("bogus", []) == {"error": "unknown op bogus"}
    assert cache_tool.du(str(tmp_path / "inductor")) == 5
    assert cache_tool.status(str(tmp_path / "none")) == {"live": {}, "snapshots": {}, "used": {}, "stale": []}


def test_cache_tool_as_c_and_as_m(tmp_path: Path):
    _tree(tmp_path)
    want = cache_tool.run("hashdir", [str(tmp_path)])
    for argv in (sn.tool_argv(sys.executable, "hashdir", str(tmp_path)),
                 [sys.executable, "-m", "orchestrator.remote.cache_tool", "hashdir", str(tmp_path)]):
        r = _run(argv)
        got = sn.tool_probe(sys.executable, "hashdir", reply=HashDirReply).parse(r)
        assert got == decode(HashDirReply, want) and got.other == want["other"]
    # a system python without dfo: -c needs nothing but the stdlib
    r = _run([sys.executable, "-I", "-S", "-c", sn.CACHE_TOOL, "hashfile", str(tmp_path / "inductor" / AWK / "f ü")])
    assert json.loads(r.stdout)["size"] == 5


# ----------------------------------------------------------------- source_hash

def _pkgs(tmp_path: Path) -> None:
    for name, body in (("pkga", b"a = 1\n"), ("pkgb", b"b = 2\n")):
        (tmp_path / name / "sub ü").mkdir(parents=True)
        (tmp_path / name / "__init__.py").write_bytes(body)
        (tmp_path / name / "sub ü" / "m.py").write_bytes(body * 2)
        (tmp_path / name / "__pycache__").mkdir()
        (tmp_path / name / "__pycache__" / "x.py").write_bytes(b"ignored")


def test_source_hash_functions(tmp_path: Path, monkeypatch):
    _pkgs(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    one = source_hash.hash_packages(["pkga"])
    assert one == {"__init__.py": hashlib.sha256(b"a = 1\n").hexdigest(),
                   "sub ü/m.py": hashlib.sha256(b"a = 1\n" * 2).hexdigest()}
    two = source_hash.hash_packages(["pkga", "pkgb"])
    assert set(two) == {"pkga/__init__.py", "pkga/sub ü/m.py", "pkgb/__init__.py", "pkgb/sub ü/m.py"}
    assert source_hash.hash_packages(["pkga", "no_such_pkg_dfo"]) == {"error": "package no_such_pkg_dfo not found"}


def test_source_hash_as_m_hashes_trainer_and_contract(tmp_path: Path):
    p = ck.source_hash_probe(sys.executable)
    r = _run(list(p.argv), cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    reply = json.loads(r.stdout)
    assert "trainer/__init__.py" in reply and "dfo_contract/fsio.py" in reply
    subpackaged = {"trainer/" + f.relative_to(REPO / "trainer").as_posix()
                   for f in (REPO / "trainer").rglob("*.py") if "__pycache__" not in f.parts}
    assert "trainer/data/stream.py" in subpackaged and "trainer/parallel/ddp.py" in subpackaged
    assert {k for k in reply if k.startswith("trainer/")} == subpackaged  # every subpackage's file
    assert reply["dfo_contract/fsio.py"] == hashlib.sha256((REPO / "dfo_contract/fsio.py").read_bytes()).hexdigest()
    assert p.parse(r) == ck.source_hash(reply)
    bad = _run([sys.executable, "-m", ck.SOURCE_HASH_MODULE, "trainer", "no_such_pkg_dfo"])
    assert bad.exit_code == 3 and p.parse(bad) is None
