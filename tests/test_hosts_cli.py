"""`dfo hosts list|trust|check` through the CLI entry point (no lab needed)."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)


HOSTS = """\
default: box
hosts:
  box:
    transport: ssh
    ssh: root@127.0.0.1:1
    root: /srv/dfo
  here:
    transport: local
    root: {root}
"""


def test_list_json(tmp_path, capsys):
    p = tmp_path / "h.yaml"
    p.write_text(HOSTS.format(root=tmp_path / "r"))
    assert main(["--hosts", str(p), "hosts", "list", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["default"] == "box"
    assert [(h["name"], h["transport"], h["default"]) for h in js["hosts"]] == [("box", "ssh", True),
                                                                              ("here", "local", False)]
    assert js["hosts"][0]["target"] == "root@127.0.0.1:1"
    assert main(["--hosts", str(p), "hosts", "list"]) == 0
    assert "box *" in capsys.readouterr().out


def test_embedded_default_check(capsys):
    assert main(["hosts", "check", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["host"] == "local" and js["reachable"] and js["python"]


def test_trust_local_is_config_error(capsys):
    assert main(["hosts", "trust", "local", "--yes"]) == 2
    assert "no SSH key to trust" in capsys.readouterr().err


def test_trust_needs_yes_without_a_terminal(tmp_path, capsys, monkeypatch):
    p = tmp_path / "h.yaml"
    p.write_text(HOSTS.format(root=tmp_path / "r"))
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    assert main(["--hosts", str(p), "hosts", "trust", "box"]) == 2
    assert "pass --yes" in capsys.readouterr().err


def test_check_unreachable_exit_3_one_line(tmp_path, capsys):
    p = tmp_path / "h.yaml"
    p.write_text(HOSTS.format(root=tmp_path / "r"))
    assert main(["--hosts", str(p), "hosts", "check", "box"]) == 3
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "dfo: error: cannot reach box (root@127.0.0.1:1): connection refused "
        "(check ssh.host and ssh.port, and that sshd runs there)"]
    assert main(["--hosts", str(p), "hosts", "check", "box", "--json"]) == 3
    js = json.loads(capsys.readouterr().out)
    assert js["reachable"] is False and js["exit_code"] == 3 and "connection refused" in js["error"]


def test_not_an_ssh_server_one_line_no_traceback(tmp_path):
    """A real process, as a user runs it: paramiko's own log output must not leak."""
    import socket
    import subprocess
    import sys
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]

    def serve():
        try:
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()
        except OSError:
            pass

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    p = tmp_path / "h.yaml"
    p.write_text(f'hosts:\n  web: {{transport: ssh, ssh: "root@127.0.0.1:{port}", root: /x}}\n')
    try:
        r = subprocess.run([sys.executable, "-c", "from orchestrator.cli import run; run()",
                            "--hosts", str(p), "hosts", "check", "web"],
                           capture_output=True, text=True, timeout=60)
    finally:
        srv.close()
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dfo: error: SSH to web (root@127.0.0.1:"), r.stderr


def test_check_reports_gpu_facts_no_gpu_here(capsys):
    """This machine has no NVIDIA driver: `gpu` says so in --json, the table says "no GPU",
    and nothing GPU-related is a problem for the cpu profile."""
    if __import__("os").path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA driver")
    assert main(["hosts", "check", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    g = js["gpu"]
    assert g["present"] is False and g["problems"] == [] and g["driver_version"] is None
    assert g["shm"]["mount"] == "/dev/shm" and g["memlock_known"] is True
    assert main(["hosts", "check"]) == 0
    assert "no GPU" in capsys.readouterr().out


def test_check_names_a_profile_without_its_lock(tmp_path, capsys):
    p = tmp_path / "h.yaml"
    p.write_text(f"hosts:\n  here:\n    transport: local\n    root: {tmp_path / 'r'}\n    profile: gpu-cu128\n")
    assert main(["--hosts", str(p), "hosts", "check", "--json"]) == 0
    probs = json.loads(capsys.readouterr().out)["problems"]
    assert any(x.startswith("profile gpu-cu128: no lock at ") and "python tools/make_lock.py gpu-cu128" in x
               and "download.pytorch.org" in x for x in probs), probs


def test_check_takes_the_host_as_every_host_command_does(tmp_path, capsys):
    (tmp_path / "hosts.yaml").write_text(HOSTS.format(root=tmp_path / "r"))
    assert main(["hosts", "check", "--host", "here", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == "here"
    assert main(["hosts", "check", "here", "--host", "here", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == "here"
    assert main(["hosts", "check", "here", "--host", "box"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NAME here and --host box name different hosts" in err[0]
