"""ssh and proxmox transports against the lab: a real OpenSSH sshd on 127.0.0.1 playing
the Proxmox node, the `pct` stand-in, and a real LXC container (VMID 200)."""

from __future__ import annotations

import json
import shlex
import re
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from orchestrator.cli import main
from orchestrator.common.errors import (ConnectError, ContainerError, HostKeyError, NotFoundError,
                                 RemoteCommandError)
from orchestrator.config.inventory import load_inventory
from orchestrator.transport.settings import SSHSettings
from orchestrator.transport.command import CONTAINER_ENV
from orchestrator.transport import CommandTimeout, knownhosts, open_transport
from orchestrator.transport.proxmox import ProxmoxTransport
from orchestrator.transport.ssh import SSHTransport

pytestmark = pytest.mark.lab

AWK = "fil () &&-@_e.txt"
CT_ROOT = "/root/dfo-transport-test"


def ssh_yaml(lab, **over) -> str:
    d = {"host": lab.ssh_host, "port": lab.ssh_port, "user": lab.ssh_user,
         "identity_file": lab.identity_file, "known_hosts": lab.known_hosts, **over}
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in d.items() if v is not None) + "}"


def write_hosts(path: Path, lab, *, vmid=None, ssh_over=None, node_root=None) -> Path:
    ssh = ssh_yaml(lab, **(ssh_over or {}))
    text = (f"default: lab\nhosts:\n"
            f"  lab:\n    transport: proxmox\n    ssh: {ssh}\n    vmid: {vmid or lab.vmid}\n"
            f"    root: {CT_ROOT}\n"
            f"  lab-node:\n    transport: ssh\n    ssh: {ssh}\n"
            f"    root: {node_root or lab.state_dir + '/node-root'}\n")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    return load_inventory(str(write_hosts(tmp_path_factory.mktemp("hosts") / "hosts.yaml", lab)))


@pytest.fixture(scope="module")
def ct(inv):
    t = open_transport(inv.get("lab"))
    assert isinstance(t, ProxmoxTransport)
    yield t
    t.close()


@pytest.fixture(scope="module")
def node(inv):
    t = open_transport(inv.get("lab-node"))
    assert type(t) is SSHTransport
    yield t
    t.close()


@pytest.fixture(params=["node", "ct"])
def tr(request, node, ct):
    return {"node": node, "ct": ct}[request.param]


# --------------------------------------------------------------------------- commands

def test_run_exit_out_err_env_cwd_stdin(tr):
    code = "import os,sys;print(os.getcwd(),os.environ['A'],sys.stdin.read());print('e',file=sys.stderr);sys.exit(7)"
    r = tr.run(["python3", "-c", code], env={"A": "$(id) x"}, cwd="/", stdin=b"in put")
    assert (r.exit_code, r.out, r.err) == (7, "/ $(id) x in put\n", "e\n")


def test_missing_command_and_cwd(tr):
    r = tr.run(["no-such-command-dfo"])
    assert r.exit_code == 127
    r = tr.run(["true"], cwd="/no/such/dir")
    assert r.exit_code == 125 and "cannot change directory" in r.err


def test_stream_lines_in_order_as_they_come(tr, inv):
    # streamed as they came, not at the end, however slow the box: the command prints line
    # 1 only once the caller got line 0 (it makes a file there over a connection of its own)
    go = tr.run(["sh", "-c", 'd=$(mktemp -d); echo "$d/go"']).out.strip()
    side = open_transport(inv.get("lab" if isinstance(tr, ProxmoxTransport) else "lab-node"))
    lines: list[str] = []

    def on_line(ln: str) -> None:
        lines.append(ln)
        if ln == "line 0":
            side.run(["touch", go], check=True)

    code = ("import os,sys,time\nprint('line',0,flush=True)\nend=time.monotonic()+120\n"
            f"while not os.path.exists({go!r}):\n"
            " assert time.monotonic()<end,'line 0 never reached the caller';time.sleep(0.02)\n"
            "for i in (1,2):\n print('line',i,flush=True)\n"
            "print('to stderr',file=sys.stderr,flush=True)\nsys.stdout.write('tail')")
    try:
        r = tr.stream(["python3", "-c", code], on_line)
    finally:
        side.close()
        tr.run(["rm", "-rf", go.rsplit("/", 1)[0]])
    assert r.exit_code == 0
    # each stream in order and whole; stdout vs stderr order is not kept across the channel
    assert [s for s in lines if s != "to stderr"] == ["line 0", "line 1", "line 2", "tail"]
    assert lines.count("to stderr") == 1


def test_a_callback_that_raises_ends_the_stream_with_its_error(tr):
    """``dfo logs`` stops on a record it cannot read: the stream must end with that error
    (not wait for a command that writes forever, nor report a lost connection)."""
    class Refused(Exception):
        pass

    seen: list[str] = []

    def refuse(line: str) -> None:
        seen.append(line)
        raise Refused(line)

    with pytest.raises(Refused, match="tick 0"):
        tr.stream(["sh", "-c", "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.2; done"],
                  refuse, timeout=600)
    assert seen == ["tick 0"]
    assert tr.run(["true"]).ok                     # the connection is still good


def test_timeout_stops_the_remote_command(tr):
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 1s"):
        tr.run(["sh", "-c", "sleep 91.25 & sleep 91.5"], timeout=1)
    assert time.monotonic() - t0 < 60     # far below the 91 s the command would take
    left = tr.run(["sh", "-c", "ps -eo args | grep '^sleep 91' || true"]).out
    assert left == ""


def test_put_get_binary_mode_and_atomic(tr, tmp_path):
    root = tr.run(["sh", "-c", "d=$(mktemp -d); echo $d"]).out.strip()
    dest = f"{root}/sub dir/{AWK}"
    data = bytes(range(256)) * 300 + b"\n\x00end"
    tr.put(data, dest, mode=0o751)
    assert tr.get(dest) == data
    st = tr.run(["stat", "-c", "%a %s", dest]).out.split()
    assert st == ["751", str(len(data))]
    src = tmp_path / "tool.sh"
    src.write_bytes(b"#!/bin/sh\necho hi\n")
    src.chmod(0o700)
    tr.put(src, dest)
    assert tr.run([dest]).out == "hi\n"
    assert tr.run(["stat", "-c", "%a", dest]).out.strip() == "700"
    assert tr.run(["ls", "-A", f"{root}/sub dir"]).out == f"{AWK}\n"  # no temp file left
    back = tmp_path / "back"
    tr.get_file(dest, back)
    assert back.read_bytes() == src.read_bytes()
    with pytest.raises(NotFoundError, match="does not exist"):
        tr.get(f"{root}/missing")
    with pytest.raises(RemoteCommandError, match="cannot overwrite directory"):
        tr.put(b"x", f"{root}/sub dir")  # a directory is never replaced by a file
    tr.run(["rm", "-rf", "--", root], check=True)


def test_one_connection_for_everything(inv):
    t = open_transport(inv.get("lab"))
    try:
        for i in range(5):
            assert t.run(["echo", str(i)]).out == f"{i}\n"
        t.put(b"x", "/tmp/dfo-one-conn")
        assert t.get("/tmp/dfo-one-conn") == b"x"
        t.run(["rm", "-f", "/tmp/dfo-one-conn"], check=True)
        t.stream(["true"], lambda ln: None)
        assert t.container_running()
        assert t.conn.connects == 1
    finally:
        t.close()


# --------------------------------------------------------------------------- proxmox specifics

def test_container_env_is_clean(ct):
    env = dict(ln.split("=", 1) for ln in ct.run(["env"]).out.splitlines())
    assert "SSH_CONNECTION" not in env and "SSH_CLIENT" not in env  # the node's env did not leak
    for k, v in CONTAINER_ENV.items():
        assert env[k] == v
    assert env.get("container") == "lxc"  # we really are inside the container
    assert ct.run(["cat", "/proc/1/comm"]).out.strip() == "systemd"


def test_put_leaves_nothing_on_the_node(ct, node):
    def listing():  # where a copy on the node would land (other tests write here too)
        return node.run(["sh", "-c", "ls -A /tmp /var/tmp ~ 2>/dev/null"]).out
    name = f"dfo-node-copy-{time.time_ns()}"  # temp names are derived from it
    ct.put(b"secret-ish payload", f"/tmp/{name}")
    assert ct.get(f"/tmp/{name}") == b"secret-ish payload"
    assert name not in listing()
    ct.run(["rm", "-f", "--", f"/tmp/{name}"], check=True)
    assert node.run(["test", "-e", f"/tmp/{name}"]).exit_code == 1


def test_unknown_vmid(lab, tmp_path):
    inv = load_inventory(str(write_hosts(tmp_path / "h.yaml", lab, vmid=987)))
    with open_transport(inv.get("lab")) as t:
        with pytest.raises(ContainerError, match="container 987 does not exist on lab"):
            t.run(["true"])


def test_pct_missing_is_not_a_proxmox_node(make_sshd, tmp_path):
    info = make_sshd()  # an sshd without the pct stand-in on PATH
    s = SSHSettings(host=info.host, port=info.port, user=info.user, identity_file=info.identity_file,
                    known_hosts=info.known_hosts)
    with ProxmoxTransport("plain", s, 200) as t:
        with pytest.raises(ConnectError, match=r"`pct` is missing on plain's host 127.0.0.1: is this a Proxmox node\?"):
            t.run(["true"])


def test_stopped_container(lab, lab_scratch, tmp_path, capsys):
    p = write_hosts(tmp_path / "h.yaml", lab, vmid=lab_scratch.vmid)
    lab_scratch.stop()
    try:
        with open_transport(load_inventory(str(p)).get("lab")) as t:
            assert not t.container_running()
            with pytest.raises(ContainerError) as ei:
                t.run(["true"])
        assert str(ei.value) == (f"container {lab_scratch.vmid} on lab is stopped "
                                 f"(start it: ssh 127.0.0.1 pct start {lab_scratch.vmid})")
        assert main(["--hosts", str(p), "hosts", "check", "lab"]) == 5
        out, err = capsys.readouterr()
        assert "stopped" in out and "Traceback" not in err
        assert main(["--hosts", str(p), "hosts", "check", "lab", "--json"]) == 5
        assert json.loads(capsys.readouterr().out)["container"] == "stopped"
    finally:
        lab_scratch.start()
    with open_transport(load_inventory(str(p)).get("lab")) as t:
        assert t.run(["true"]).ok


# --------------------------------------------------------------------------- host keys, auth

def test_unknown_host_refused_with_fingerprint_then_trusted(lab, tmp_path, capsys):
    kh = tmp_path / "empty_known_hosts"
    p = write_hosts(tmp_path / "h.yaml", lab, ssh_over={"known_hosts": str(kh)})
    inv = load_inventory(str(p))
    server_key = paramiko.PKey.from_type_string(lab.host_public_key.split()[0],
                                                __import__("base64").b64decode(lab.host_public_key.split()[1]))
    fp = knownhosts.fingerprint(server_key)
    with open_transport(inv.get("lab-node")) as t:
        with pytest.raises(HostKeyError) as ei:
            t.run(["true"])
    msg = str(ei.value)
    assert fp in msg and "dfo hosts trust lab-node" in msg and "is not known" in msg
    assert not kh.exists()  # nothing was auto-added
    # through the CLI: exit 4, one line
    assert main(["--hosts", str(p), "hosts", "check", "lab-node"]) == 4
    capsys.readouterr()
    # trust it
    assert main(["--hosts", str(p), "hosts", "trust", "lab-node", "--yes"]) == 0
    out = capsys.readouterr().out
    assert fp in out and "trusted" in out
    assert knownhosts.status(str(kh), f"[{lab.ssh_host}]:{lab.ssh_port}", server_key) == knownhosts.KNOWN
    assert main(["--hosts", str(p), "hosts", "trust", "lab-node", "--yes"]) == 0
    assert "already trusted" in capsys.readouterr().out
    with open_transport(inv.get("lab-node")) as t:
        assert t.run(["echo", "ok"]).out == "ok\n"


def test_trust_without_a_terminal_checks_an_already_trusted_host(lab, tmp_path, capsys,
                                                                  monkeypatch):
    kh = tmp_path / "known_hosts"
    p = write_hosts(tmp_path / "h.yaml", lab, ssh_over={"known_hosts": str(kh)})
    monkeypatch.setattr("sys.stdin", open("/dev/null"))
    assert main(["--hosts", str(p), "hosts", "trust", "lab-node"]) == 2     # would have to ask
    assert "pass --yes" in capsys.readouterr().err and not kh.exists()
    assert main(["--hosts", str(p), "hosts", "trust", "lab-node", "--yes"]) == 0
    capsys.readouterr()
    rc = main(["--hosts", str(p), "hosts", "trust", "lab-node"])
    out, err = capsys.readouterr()
    assert rc == 0 and "lab-node: already trusted: " in out and err == "", (out, err)


def test_changed_host_key_refused_loudly(lab, tmp_path, capsys):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{lab.ssh_host}]:{lab.ssh_port} {(tmp_path / 'other_key.pub').read_text().split(' ')[0]} "
                  f"{(tmp_path / 'other_key.pub').read_text().split(' ')[1]}\n")
    p = write_hosts(tmp_path / "h.yaml", lab, ssh_over={"known_hosts": str(kh)})
    inv = load_inventory(str(p))
    with open_transport(inv.get("lab")) as t:
        with pytest.raises(HostKeyError, match="REMOTE HOST KEY CHANGED for lab"):
            t.run(["true"])
    assert main(["--hosts", str(p), "hosts", "check", "lab"]) == 4
    assert "REMOTE HOST KEY CHANGED" in capsys.readouterr().err
    # trust refuses a changed key without --replace, replaces it with
    assert main(["--hosts", str(p), "hosts", "trust", "lab", "--yes"]) == 4
    err = capsys.readouterr().err
    assert "REMOTE HOST KEY CHANGED" in err
    new_fp = re.search(r"it now offers \S+ (SHA256:[A-Za-z0-9+/=]+)", err).group(1)
    # non-interactive replace needs the fingerprint verified out of band, and it must match
    assert main(["--hosts", str(p), "hosts", "trust", "lab", "--yes", "--replace"]) == 2
    assert "--fingerprint SHA256:" in capsys.readouterr().err
    assert main(["--hosts", str(p), "hosts", "trust", "lab", "--yes", "--replace",
                 "--fingerprint", "SHA256:not-this-one"]) == 4
    assert "not the expected SHA256:not-this-one" in capsys.readouterr().err
    assert main(["--hosts", str(p), "hosts", "trust", "lab", "--yes", "--replace",
                 "--fingerprint", new_fp]) == 0
    assert "key replaced" in capsys.readouterr().out
    with open_transport(load_inventory(str(p)).get("lab")) as t:
        assert t.run(["true"]).ok


def test_auth_failure(lab, tmp_path):
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    p = write_hosts(tmp_path / "h.yaml", lab, ssh_over={"identity_file": str(wrong)})
    with open_transport(load_inventory(str(p)).get("lab-node")) as t:
        with pytest.raises(ConnectError, match="authentication failed for lab-node .*check ssh.user and ssh.identity_file"):
            t.run(["true"])


def test_proxy_jump_through_the_node(lab, tmp_path):
    # the lab node jumps to itself: a direct-tcpip channel of the first connection
    p = write_hosts(tmp_path / "h.yaml", lab,
                    ssh_over={"proxy_jump": f"{lab.ssh_user}@{lab.ssh_host}:{lab.ssh_port}"})
    with open_transport(load_inventory(str(p)).get("lab")) as t:
        assert t.run(["echo", AWK]).out == AWK + "\n"
        assert len(t.conn._clients) == 2 and t.conn.connects == 1


# --------------------------------------------------------------------------- dfo hosts check

def test_hosts_check_lab(lab, tmp_path, capsys):
    p = write_hosts(tmp_path / "h.yaml", lab)
    assert main(["--hosts", str(p), "hosts", "check", "lab"]) == 0
    out = capsys.readouterr().out
    assert "running" in out and "systemd pid 1" in out and "python" in out
    assert main(["--hosts", str(p), "hosts", "check", "lab", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["reachable"] and js["container"] == "running" and js["systemd_pid1"] is True
    assert js["python"]["version"].startswith("3.") and js["disk"]["free_bytes"] > 0
    assert js["gpus"]["present"] is False and js["problems"] == []


def test_hosts_check_via_openssh_agrees(lab, ct):
    """Cross-check with the real OpenSSH client: the same container answers."""
    cmd = shlex.join(["pct", "exec", str(lab.vmid), "--", "cat", "/etc/hostname"])
    via_openssh = subprocess.run(lab.ssh_argv(cmd), capture_output=True, text=True, timeout=30)
    assert via_openssh.returncode == 0, via_openssh.stderr
    assert ct.run(["cat", "/etc/hostname"]).out == via_openssh.stdout


# --------------------------------------------------------------------------- dropped connections

def test_dropped_connection_mid_stream_then_reconnect(inv):
    import threading

    t = open_transport(inv.get("lab"))
    try:
        assert t.run(["true"]).ok and t.conn.connects == 1
        seen: list[str] = []

        def drop_after_first_line(line: str) -> None:
            seen.append(line)
            if len(seen) == 1:  # the link dies under a running command
                threading.Thread(target=t.conn._clients[-1].get_transport().close).start()

        with pytest.raises(ConnectError, match="connection to lab .* failed"):
            t.stream(["sh", "-c", "echo first; sleep 30; echo never"], drop_after_first_line, timeout=60)
        assert seen == ["first"]
        # the next operation opens a new connection by itself
        assert t.run(["echo", "again"]).out == "again\n"
        assert t.conn.connects == 2
    finally:
        t.close()
