"""Lab self-tests: the LXC container itself (network, init, mounts) and the
start/stop cycle on the scratch container 201 (never on 200: other sessions
share it)."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.lab.client import ct, ssh

pytestmark = pytest.mark.lab


def test_container_has_no_network_but_loopback(lab):
    p = ct(lab, "python3", "-c",
           "import socket; print(' '.join(sorted(n for _, n in socket.if_nameindex())))")
    assert p.stdout.decode().split() == ["lo"]
    routes = ct(lab, "cat", "/proc/net/route").stdout.decode().strip().splitlines()
    assert routes[1:] == []  # only the header: no route anywhere
    # loopback works inside
    p = ct(lab, "python3", "-c",
           "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
           "c=socket.create_connection(s.getsockname()); print('ok')")
    assert p.stdout == b"ok\n"


def test_systemd_is_pid_1_and_booted(lab):
    assert ct(lab, "cat", "/proc/1/comm").stdout == b"systemd\n"
    assert ct(lab, "systemctl", "is-system-running").stdout.decode().strip() == "running"


def test_container_python_is_3_11_and_tools_exist(lab):
    assert ct(lab, "python3", "-c", "import sys; print(sys.version_info[:2])").stdout == b"(3, 11)\n"
    for tool in ("ps", "flock", "tar", "zstd", "setsid", "nsenter", "timeout"):
        assert ct(lab, "sh", "-c", 'command -v "$1"', "sh", tool).returncode == 0, tool


def test_wheelhouse_is_bind_mounted_read_only(lab):
    name = f"probe-{uuid.uuid4().hex}.txt"
    host_file = os.path.join(lab.wheelhouse_host_dir, name)
    with open(host_file, "w") as f:
        f.write("wheel\n")
    try:
        inside = f"{lab.wheelhouse_container_dir}/{name}"
        assert ct(lab, "cat", inside).stdout == b"wheel\n"
        p = ct(lab, "touch", f"{lab.wheelhouse_container_dir}/new")
        assert p.returncode != 0 and b"Read-only file system" in p.stderr
    finally:
        os.unlink(host_file)


def test_stop_and_start_scratch_container(lab, lab_scratch):
    vmid = str(lab_scratch.vmid)
    if ssh(lab, ["pct", "status", vmid]).stdout == b"status: stopped\n":
        assert ssh(lab, ["pct", "start", vmid]).returncode == 0
    assert ssh(lab, ["pct", "status", vmid]).stdout == b"status: running\n"
    assert ssh(lab, ["pct", "exec", vmid, "--", "true"]).returncode == 0
    p = ssh(lab, ["pct", "start", vmid])
    assert p.returncode == 255 and f"CT {vmid} already running".encode() in p.stderr

    assert ssh(lab, ["pct", "stop", vmid]).returncode == 0
    assert ssh(lab, ["pct", "status", vmid]).stdout == b"status: stopped\n"
    assert ssh(lab, ["pct", "exec", vmid, "--", "true"]).returncode != 0
    p = ssh(lab, ["pct", "push", vmid, "/etc/hostname", "/tmp/x"])
    assert p.returncode != 0 and b"can only push files to a running CT" in p.stderr
    p = ssh(lab, ["pct", "stop", vmid])
    assert p.returncode == 255 and f"CT {vmid} not running".encode() in p.stderr
    # the main container was not touched
    assert ssh(lab, ["pct", "status", str(lab.vmid)]).stdout == b"status: running\n"


def test_pct_list_shows_lab_containers(lab):
    out = ssh(lab, ["pct", "list"]).stdout.decode().splitlines()
    assert out[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert any(ln.split()[:2] == [str(lab.vmid), "running"] for ln in out[1:])
