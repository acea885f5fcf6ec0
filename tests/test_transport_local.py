"""The local transport: real subprocesses, real files."""

from __future__ import annotations

import sys
import time

import pytest

from dfo_contract.procs import alive
from orchestrator.common.errors import NotFoundError, RemoteCommandError
from orchestrator.config.inventory import load_inventory
from orchestrator.transport import CommandTimeout, LocalTransport, open_transport


@pytest.fixture
def t():
    return LocalTransport("local")


def test_open_transport_for_embedded_default(monkeypatch, tmp_path):
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    host = load_inventory(None).get(None)
    tr = open_transport(host)
    assert isinstance(tr, LocalTransport) and tr.name == "local" and tr.container_running()


def test_run_captures_exit_out_err(t):
    r = t.run([sys.executable, "-c", "import sys;print('out');print('err',file=sys.stderr);sys.exit(3)"])
    assert (r.exit_code, r.out, r.err) == (3, "out\n", "err\n")
    with pytest.raises(RemoteCommandError, match="exited 3: err"):
        r.check()


def test_env_cwd_stdin(t, tmp_path):
    r = t.run([sys.executable, "-c", "import os,sys;print(os.getcwd(), os.environ['A'], sys.stdin.read())"],
              env={"A": "$(x)"}, cwd=str(tmp_path), stdin=b"in put")
    assert r.ok and r.out == f"{tmp_path} $(x) in put\n"


def test_missing_command_and_cwd_like_env(t, tmp_path):
    r = t.run(["no-such-command-dfo"])
    assert r.exit_code == 127 and "no-such-command-dfo" in r.err
    r = t.run(["true"], cwd=str(tmp_path / "missing"))
    assert r.exit_code == 125 and "cannot change directory" in r.err


def test_timeout_kills_the_process_group(t, tmp_path):
    pidfile = tmp_path / "child.pid"
    code = f"import os,subprocess,time;p=subprocess.Popen(['sleep','60']);open({str(pidfile)!r},'w').write(str(p.pid));time.sleep(60)"
    t0 = time.monotonic()
    # 10 s: the child (an interpreter starting on a possibly busy box) has written its
    # grandchild's pid by then; far below the 60 s the command would take
    with pytest.raises(CommandTimeout, match="timed out after 10s"):
        t.run([sys.executable, "-c", code], timeout=10)
    assert time.monotonic() - t0 < 45
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while alive(child):   # gone, or a zombie that init reaps eventually
        if time.monotonic() > deadline:
            pytest.fail("the grandchild survived the timeout")
        time.sleep(0.1)


def test_stream_lines_as_they_come(t, tmp_path):
    # the command prints line 1 only once the caller got line 0 (a file the callback makes):
    # streamed, not collected at the end, however slow the box
    go = tmp_path / "go"
    seen: list[str] = []

    def on_line(ln: str) -> None:
        seen.append(ln)
        if ln == "line 0":
            go.touch()

    code = ("import os,sys,time\nprint('line',0,flush=True)\nend=time.monotonic()+120\n"
            f"while not os.path.exists({str(go)!r}):\n"
            " assert time.monotonic()<end,'line 0 never reached the caller';time.sleep(0.02)\n"
            "for i in (1,2):\n print('line',i,flush=True)\n"
            "print('oops',file=sys.stderr)\nsys.stdout.write('tail')")
    r = t.stream([sys.executable, "-c", code], on_line)
    assert r.exit_code == 0 and r.stdout == b""
    assert seen == ["line 0", "line 1", "line 2", "oops", "tail"]


def test_stream_timeout(t):
    with pytest.raises(CommandTimeout):
        t.stream(["sleep", "30"], lambda ln: None, timeout=0.5)


def test_put_get_atomic_with_mode(t, tmp_path):
    dest = tmp_path / "a" / "fil () &&-@_e.txt"
    t.put(b"hello\x00", str(dest), mode=0o640)
    assert t.get(str(dest)) == b"hello\x00" and (dest.stat().st_mode & 0o777) == 0o640
    src = tmp_path / "script.sh"
    src.write_bytes(b"#!/bin/sh\necho hi\n")
    src.chmod(0o755)
    t.put(src, str(dest))
    assert dest.read_bytes() == src.read_bytes() and (dest.stat().st_mode & 0o777) == 0o755
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    back = tmp_path / "back"
    t.get_file(str(dest), back)
    assert back.read_bytes() == src.read_bytes()


def test_get_missing(t, tmp_path):
    with pytest.raises(NotFoundError, match="does not exist on local"):
        t.get(str(tmp_path / "nope"))


def test_a_command_given_no_cwd_runs_in_a_neutral_directory_not_the_callers(t, tmp_path,
                                                                            monkeypatch):
    (tmp_path / "shadowed.py").write_text("print('the module in the caller\\'s directory')\n")
    monkeypatch.chdir(tmp_path)
    r = t.run([sys.executable, "-m", "shadowed"])
    assert r.exit_code == 1 and "No module named shadowed" in r.err, (r.out, r.err)
    r = t.run([sys.executable, "-c", "import os; print(os.getcwd())"])
    assert r.out == "/\n"
    r = t.run([sys.executable, "-m", "shadowed"], cwd=str(tmp_path))     # a cwd given: used
    assert r.ok and "caller's directory" in r.out
