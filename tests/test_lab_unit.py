"""Plain unit tests of the lab's pure parts (no root, no sshd, no LXC)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


from orchestrator.config.inventory import parse_inventory
from tests.lab import LabInfo
from tests.lab.lab import Lab
from dfo_contract.fsio import atomic_write_text
from tests.lab.procs import free_port, pid_matches

PCT = Path(__file__).resolve().parent / "lab" / "pct"


def _info(tmp_path, vmid=200) -> LabInfo:
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key\n")
    return LabInfo(ssh_host="127.0.0.1", ssh_port=40123, ssh_user="root", identity_file=str(key),
                   known_hosts=str(tmp_path / "known_hosts"), ssh_config=str(tmp_path / "ssh_config"),
                   host_public_key="ssh-ed25519 AAAA", vmid=vmid,
                   container_name=f"dfo-lab-{vmid}" if vmid else None,
                   wheelhouse_host_dir=str(tmp_path / "wh"), wheelhouse_container_dir="/mnt/wheelhouse",
                   state_dir=str(tmp_path), bin_dir=str(tmp_path / "bin"))


def test_hosts_yaml_is_a_valid_inventory(tmp_path):
    info = _info(tmp_path)
    inv = parse_inventory(info.hosts_yaml(root="/root/dfo-x"), "hosts.yaml")
    lab = inv.get("lab")
    assert inv.get(None).name == "lab"
    assert (lab.transport, lab.vmid, lab.root) == ("proxmox", 200, "/root/dfo-x")
    assert (lab.ssh.host, lab.ssh.port, lab.ssh.user) == ("127.0.0.1", 40123, "root")
    assert lab.ssh.identity_file == info.identity_file and lab.ssh.known_hosts == info.known_hosts
    node = inv.get("lab-node")
    assert node.transport == "ssh" and node.root == str(tmp_path / "node-root")
    assert lab.wheelhouse is None


def test_hosts_yaml_wheelhouse_and_without_container(tmp_path):
    inv = parse_inventory(_info(tmp_path).hosts_yaml(wheelhouse=True), "hosts.yaml")
    assert inv.get("lab").wheelhouse == "/mnt/wheelhouse"
    assert inv.get("lab-node").wheelhouse == str(tmp_path / "wh")
    inv = parse_inventory(_info(tmp_path, vmid=None).hosts_yaml(), "hosts.yaml")
    assert inv.get(None).name == "lab-node"


def _pct(*args, env=None):
    return subprocess.run(["bash", str(PCT), *args], capture_output=True, text=True,
                          env={**os.environ, "DFO_PCT_PREFIX": "dfo-lab-unit-none-", **(env or {})})


def test_pct_errors_without_a_container():
    p = _pct("status", "4242")
    assert p.returncode == 2
    assert p.stderr.strip().startswith("Configuration file 'nodes/") and "/lxc/4242.conf' does not exist" in p.stderr
    assert _pct("status", "12").returncode == 255  # not a VM ID
    assert _pct("exec", "4242", "--keep-env", "maybe", "--", "true").returncode == 255
    p = _pct("frobnicate")
    assert p.returncode == 255 and "unknown command 'pct frobnicate'" in p.stderr
    p = _pct("push", "4242", "/etc/hostname", "/x", "--perms", "0x1g")
    assert p.returncode == 255 and "invalid mode: '0x1g'" in p.stderr
    assert _pct().returncode == 255


def test_pid_matches_only_our_process():
    assert pid_matches(os.getpid(), sys.executable) or pid_matches(os.getpid(), "python")
    assert not pid_matches(os.getpid(), "/definitely/not/in/argv.conf")
    assert not pid_matches(None, "x")
    assert not pid_matches(2**22 + 12345, "x")  # no such process


def test_free_port_prefers_a_free_one_and_avoids_a_taken_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert free_port(taken) != taken
    p = free_port()
    assert free_port(p) == p


def test_write_atomic_leaves_no_temporary(tmp_path):
    atomic_write_text(tmp_path / "f", "data", mode=0o600)
    assert (tmp_path / "f").read_text() == "data"
    assert ((tmp_path / "f").stat().st_mode & 0o777) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_dead_leases_are_pruned_named_ones_kept(tmp_path):
    lab = Lab(tmp_path / "lab")
    lab.leases_dir.mkdir(parents=True)
    (lab.leases_dir / "pid-1234567").write_text(json.dumps({"pid": 2**22 + 7, "start": "1"}))
    (lab.leases_dir / "manual").write_text("{}")
    lab._take_lease(None)  # this process: alive
    assert sorted(lab._live_leases()) == ["manual", f"pid-{os.getpid()}"]
    assert not (lab.leases_dir / "pid-1234567").exists()
    # a reused PID (same pid, other start time) is not a live lease
    (lab.leases_dir / f"pid-{os.getpid()}").write_text(json.dumps({"pid": os.getpid(), "start": "0"}))
    assert lab._live_leases() == ["manual"]
