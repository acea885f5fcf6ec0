"""``--group`` on ``dfo deploy``, ``dfo warm-cache`` and ``dfo hosts check`` through the CLI
entry point: two ``transport: local`` hosts with their own roots (and an ssh host nobody
answers, on loopback), real listeners and connections on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket

import pytest

from orchestrator.cli import main
from tests.lab.procs import free_port_pair

FP = {"profile": "cpu", "lock_hash": "a" * 64, "dfo": "0.1.0", "python": "3.11.7",
      "torch": "2.13.0+cpu", "torch_cuda": None, "transformers": "5.17.0"}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    monkeypatch.setenv("DFO_PROGRESS_EVERY", "1")
    monkeypatch.chdir(tmp_path)


def hosts_file(tmp_path, *, head_addr="127.0.0.1", port=None, members="[n1, n2]") -> str:
    port = port or free_port_pair()
    p = tmp_path / "hosts.yaml"
    p.write_text(f"""\
hosts:
  n1: {{transport: local, root: {tmp_path}/r1}}
  n2: {{transport: local, root: {tmp_path}/r2}}
  box: {{transport: ssh, ssh: 'root@127.0.0.1:1', root: /srv/dfo}}
groups:
  pair: {{hosts: {members}, head_addr: {head_addr}, port: {port}, ifname: lo}}
""")
    return str(p)


def fake_env(root, fp) -> None:
    """A deployed env as far as the group check reads it: envs/current/fingerprint.json."""
    env = root / "envs" / "cpu-x"
    env.mkdir(parents=True)
    (env / "fingerprint.json").write_text(json.dumps(fp))
    os.symlink("cpu-x", root / "envs" / "current")


@pytest.mark.parametrize("argv", [["deploy", "--host", "n1", "--group", "pair"],
                                  ["warm-cache", "--host", "n1", "--group", "pair"],
                                  ["hosts", "check", "n1", "--group", "pair"]])
def test_host_and_group_exclusive(tmp_path, capsys, argv):
    assert main(["--hosts", hosts_file(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("dfo: error: ") and "cannot be combined" in err


@pytest.mark.parametrize("argv", [["deploy", "--group", "pari"], ["hosts", "check", "--group", "pari"],
                                  ["warm-cache", "--group", "pari"]])
def test_unknown_group(tmp_path, capsys, argv):
    assert main(["--hosts", hosts_file(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dfo: error: unknown group 'pari' in {tmp_path}/hosts.yaml (did you mean 'pair'?); " \
                  "known groups: pair"


def test_warm_cache_group_refuses_one_host_modes(tmp_path, capsys):
    assert main(["--hosts", hosts_file(tmp_path), "warm-cache", "--group", "pair", "--status"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--status works on one host: use --host NAME" in err and "\n" not in err


def test_check_group_agreeing_envs(tmp_path, capsys):
    fake_env(tmp_path / "r1", FP)
    fake_env(tmp_path / "r2", FP)
    hf = hosts_file(tmp_path)
    assert main(["--hosts", hf, "hosts", "check", "--group", "pair", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["ok"] and js["exit_code"] == 0 and js["env_differences"] == []
    assert [h["host"] for h in js["hosts"]] == ["n1", "n2"]
    assert [(r["host"], r["ok"], r["role"]) for r in js["reach"]] == [("n1", True, "head"),
                                                                      ("n2", True, "member")]
    assert main(["--hosts", hf, "hosts", "check", "--group", "pair"]) == 0
    out = capsys.readouterr().out
    assert "reaches 127.0.0.1:" in out and "env cpu torch 2.13.0+cpu" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_check_group_env_differs(tmp_path, capsys):
    fake_env(tmp_path / "r1", FP)
    fake_env(tmp_path / "r2", dict(FP, torch="2.12.0+cpu"))
    assert main(["--hosts", hosts_file(tmp_path), "hosts", "check", "--group", "pair", "--json"]) == 7
    cap = capsys.readouterr()
    js = json.loads(cap.out)
    assert [d["message"] for d in js["env_differences"]] == [
        "n2's env differs from n1's (torch 2.12.0+cpu vs 2.13.0+cpu): run dfo deploy --group pair"]
    assert cap.err.strip().splitlines()[-1] == (
        "dfo: error: hosts check --group pair: n2's env differs from n1's (torch 2.12.0+cpu vs "
        "2.13.0+cpu): run dfo deploy --group pair")


def test_check_group_port_taken_on_head(tmp_path, capsys):
    fake_env(tmp_path / "r1", FP)
    fake_env(tmp_path / "r2", FP)
    with socket.socket() as hold:
        hold.bind(("127.0.0.1", 0))
        hold.listen()
        port = hold.getsockname()[1]
        rc = main(["--hosts", hosts_file(tmp_path, port=port), "hosts", "check", "--group", "pair",
                   "--json"])
    js = json.loads(capsys.readouterr().out)
    assert rc == 3 and not js["reach"][0]["ok"]
    assert f"port {port} is already taken on n1" in js["reach"][0]["message"]
    assert js["reach"][1]["ok"]  # port+1 was free and reached


def test_check_group_head_addr_not_the_heads(tmp_path, capsys):
    """192.0.2.1 (TEST-NET-1) is no address of this machine: nothing is sent anywhere."""
    fake_env(tmp_path / "r1", FP)
    fake_env(tmp_path / "r2", FP)
    rc = main(["--hosts", hosts_file(tmp_path, head_addr="192.0.2.1"), "hosts", "check", "--group",
               "pair"])
    cap = capsys.readouterr()
    assert rc == 3
    assert "192.0.2.1 is not an address of n1" in cap.err and "fix head_addr" in cap.err


def test_check_group_one_member_down_does_not_hide_the_other(tmp_path, capsys):
    fake_env(tmp_path / "r1", FP)
    rc = main(["--hosts", hosts_file(tmp_path, members="[n1, box]"), "hosts", "check", "--group",
               "pair", "--json"])
    js = json.loads(capsys.readouterr().out)
    assert rc == 3
    n1, box = js["hosts"]
    assert n1["ok"] and n1["check"]["python"] and n1["fingerprint"]["torch"] == "2.13.0+cpu"
    assert not box["ok"] and box["exit_code"] == 3 and "127.0.0.1" in box["error"]
    assert [r["host"] for r in js["reach"]] == ["n1"]  # box was not reached: not probed


def test_deploy_check_group_reports_every_member(tmp_path, capsys):
    """--check on a group: nothing deployed on n1 (drift, exit 7), box unreachable (exit 3):
    both reported, the exit code is the first failing member's in the group's order."""
    hf = hosts_file(tmp_path, members="[n1, box]")
    rc = main(["--hosts", hf, "deploy", "--check", "--group", "pair", "--json"])
    cap = capsys.readouterr()
    js = json.loads(cap.out)
    assert rc == 7 and js["exit_code"] == 7 and js["action"] == "check"
    n1, box = js["hosts"]
    assert n1["exit_code"] == 7 and "no env deployed" in n1["result"]["drift"][0]
    assert box["exit_code"] == 3 and box["result"] is None
    assert cap.err.strip().splitlines()[-1].startswith(
        "dfo: error: deploy --group pair: 2 of 2 host(s) failed; first: n1: envs/current")
    rc = main(["--hosts", hf, "deploy", "--check", "--group", "pair"])
    out = capsys.readouterr().out
    assert rc == 7 and "envs/current differs from its lock" in out and "box" in out


def test_host_rows_plain_lines_from_threads():
    """In a pipe: timestamped `LABEL: HOST: text` lines, a steady `still working` line, a
    line when a host ends; updates from several threads at once."""
    import io
    import re
    import threading
    import time

    from rich.console import Console

    from orchestrator.cli.console import HostRows

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=False, width=4096)
    with HostRows("deploy pair", ["n1", "n2"], con=con, every=0.2) as rows:
        rows._t0 -= 5  # past the quiet start
        ths = [threading.Thread(target=lambda h=h: [rows.update(h, f"install: {i}") for i in range(50)])
               for h in ("n1", "n2")]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        deadline = time.monotonic() + 30
        while "still working" not in buf.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        rows.finish("n1", True, "create in 3.0s")
        rows.finish("n2", False, "cannot reach n2")
    lines = buf.getvalue().splitlines()
    assert all(re.match(r"^\d\d:\d\d:\d\d deploy pair: n[12]: ", x) for x in lines), lines
    assert any("n1: install: " in x for x in lines) and any("still working" in x for x in lines)
    assert any("n1: done: create in 3.0s" in x for x in lines)
    assert any("n2: FAILED: cannot reach n2" in x for x in lines)


def test_host_rows_terminal_render():
    import io

    from rich.console import Console

    from orchestrator.cli.console import HostRows

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80)
    with HostRows("check pair", ["n1", "n2"], con=con) as rows:
        rows.update("n1", "checking the host")
        rows.finish("n2", False, "cannot reach n2")
        rows.finish("n1", True, "python 3.11.7")
    out = buf.getvalue()
    assert "python 3.11.7" in out and "cannot reach n2" in out and "✓" in out and "✗" in out


def test_transports_opened_from_many_threads_are_one_per_host(tmp_path, monkeypatch):
    """--group opens each member's transport in its own thread: still one per host, even
    when opening one takes a while (as an SSH transport's setup can)."""
    import threading
    import time

    import orchestrator.transport as tr
    from orchestrator.cli.context import AppContext

    real = tr.open_transport

    def slow_open(host):
        time.sleep(0.2)
        return real(host)
    monkeypatch.setattr(tr, "open_transport", slow_open)
    app = AppContext(hosts_file=hosts_file(tmp_path))
    got = []
    barrier = threading.Barrier(8)

    def grab(name):
        barrier.wait()
        got.append((name, app.transport(name)))
    ths = [threading.Thread(target=grab, args=("n1" if i % 2 else "n2",)) for i in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert len({id(t) for n, t in got if n == "n1"}) == 1 and len({id(t) for n, t in got if n == "n2"}) == 1
    app.close()


def test_warm_cache_group_reports_each_member(tmp_path, capsys):
    """No env on either member: each says so on its own row; exit 7 (the first's)."""
    rc = main(["--hosts", hosts_file(tmp_path), "warm-cache", "--group", "pair",
               "--set", "compile.enabled=true", "--json"])
    cap = capsys.readouterr()
    js = json.loads(cap.out)
    assert rc == 7 and js["exit_code"] == 7 and not js["ok"]
    assert [(h["host"], h["exit_code"]) for h in js["hosts"]] == [("n1", 7), ("n2", 7)]
    assert all(f"no deployed env on {h['host']}" in h["error"] for h in js["hosts"])
    assert cap.err.strip().splitlines()[-1].startswith(
        "dfo: error: warm-cache --group pair: 2 of 2 host(s) failed; first: n1: no deployed env on n1")


def test_hosts_list_shows_groups(tmp_path, capsys):
    hf = hosts_file(tmp_path, port=29555)
    assert main(["--hosts", hf, "hosts", "list", "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["groups"]
    assert g == [{"name": "pair", "hosts": ["n1", "n2"], "head": "n1", "head_addr": "127.0.0.1",
                  "port": 29555, "coord_port": 29556, "gpus": {}, "ifname": "lo",
                  "source": f"{hf}:6"}]
    assert main(["--hosts", hf, "hosts", "list"]) == 0
    assert "group pair: n1, n2 (head n1 at 127.0.0.1:29555)" in capsys.readouterr().out
