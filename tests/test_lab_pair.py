"""Lab self-tests: the pair of containers (202, 203) on a bridge inside the lab's own
network namespace (tests/lab/pair.py, tests/lab/netns.py). Commands reach the
containers the way dfo does: hosts.yaml -> proxmox transport -> ssh node -> pct exec."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import load_inventory
from orchestrator.transport import open_transport
from tests.lab import LabInfo, LabUnavailable, netns
from tests.lab.client import ssh
from tests.lab.pair import Pair, PairInfo, net_lines

PORT = 29491  # the probe listener in the head container (its own netns: no clash with the host)

LISTENER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(90)
c, peer = s.accept()
msg = c.recv(100).decode()
c.sendall(("pong " + msg + " from " + socket.gethostname()).encode())
c.close()
print("peer", peer[0], "said", msg)
"""

CLIENT = r"""
import socket, sys, time
deadline = time.monotonic() + 90
while True:  # the listener may not be listening yet
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
c.sendall(sys.argv[3].encode())
print(c.recv(200).decode())
"""


def _transports(pair: PairInfo, tmp_path: Path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(pair.hosts_yaml(groups=False))
    inv = load_inventory(str(hosts))
    return [open_transport(inv.get(n)) for n in pair.host_names]


def _mn0(t) -> list[str]:
    r = t.run(["ip", "-4", "-j", "addr", "show", "dev", "mn0"], timeout=60, check=True)
    return [f"{a['local']}/{a['prefixlen']}" for d in json.loads(r.out) for a in d["addr_info"]]


@pytest.mark.lab
def test_both_containers_up_each_with_its_address(lab_pair: PairInfo, tmp_path):
    for t, addr, name in zip(_transports(lab_pair, tmp_path), lab_pair.addresses,
                             ("dfo-lab-202", "dfo-lab-203"), strict=True):
        assert _mn0(t) == [f"{addr}/24"]
        names = t.run(["python3", "-c", "import socket; print(socket.gethostname(), "
                       "sorted(n for _, n in socket.if_nameindex()))"], timeout=60, check=True).out
        assert names.split(" ", 1) == [name, "['lo', 'mn0']\n"]
        # the route to the subnet, nothing else (no default route out of the bridge)
        routes = t.run(["cat", "/proc/net/route"], timeout=60, check=True).out.splitlines()[1:]
        assert [(r.split()[0], r.split()[1]) for r in routes] == [("mn0", "00004D0A")]  # 10.77.0.0
        t.close()


@pytest.mark.lab
def test_tcp_from_peer_to_head_over_the_bridge(lab_pair: PairInfo, tmp_path):
    head, peer = _transports(lab_pair, tmp_path)
    got = {}

    def listen():
        got["head"] = head.run(["python3", "-c", LISTENER, lab_pair.head_addr, str(PORT)], timeout=120)

    th = threading.Thread(target=listen)
    th.start()
    try:
        r = peer.run(["python3", "-c", CLIENT, lab_pair.head_addr, str(PORT), "ping-42"], timeout=120)
    finally:
        th.join(150)
    assert r.ok, r.err
    assert r.out.strip() == "pong ping-42 from dfo-lab-202"
    assert got["head"].ok, got["head"].err
    assert got["head"].out.strip() == f"peer {lab_pair.addresses[1]} said ping-42"
    head.close()
    peer.close()


@pytest.mark.lab
def test_host_netns_has_no_interface_address_or_route_into_the_subnet(lab_pair: PairInfo):
    view = netns.host_view()
    assert view == {"interfaces": [], "addresses": [], "routes": []}
    # the host would send 10.77.0.1 wherever its default route goes, never to the pair
    # (`ip route get` only looks the route up; no packet is sent)
    p = subprocess.run(["ip", "-j", "route", "get", lab_pair.head_addr], capture_output=True, text=True)
    if p.returncode == 0:
        dev = json.loads(p.stdout)[0].get("dev", "")
        assert not dev.startswith("dfo") and dev != "br0" and dev != "lo", dev
    # everything of the pair network lives in the namespace
    st = netns.status()
    assert st == {"netns": "dfo-lab-mn", "up": True, "ports": ["dfo202br", "dfo203br"]}


@pytest.mark.lab
def test_up_again_is_a_noop_and_repairs_a_stopped_member_and_a_lost_namespace(
        lab_pair: PairInfo, _lab_manager, tmp_path):
    pair = Pair(_lab_manager)
    head, _ = _transports(lab_pair, tmp_path)
    mac = lambda t: json.loads(t.run(["ip", "-j", "link", "show", "mn0"], timeout=60,  # noqa: E731
                                     check=True).out)[0]["address"]
    before = mac(head)
    pair.up()  # everything is up: nothing is restarted or remade
    assert mac(head) == before

    # a member stopped the way a person would (pct stop on the node): its veth end goes
    # back to the host namespace (down, no address) and the next up starts it again
    assert ssh(lab_pair.lab, ["pct", "stop", "203"]).returncode == 0
    assert netns.host_view()["interfaces"] == ["dfo203ct"] and netns.host_view()["addresses"] == []
    pair.up()
    assert netns.host_view()["interfaces"] == []
    _, peer = _transports(lab_pair, tmp_path)
    assert _mn0(peer) == ["10.77.0.2/24"]

    # the namespace deleted under running containers (a killed run, a person): remade,
    # and both containers restarted onto the new bridge
    assert subprocess.run(["ip", "netns", "del", "dfo-lab-mn"]).returncode == 0
    pair.up()
    assert netns.status()["ports"] == ["dfo202br", "dfo203br"]
    head, peer = _transports(lab_pair, tmp_path)
    assert _mn0(head) == ["10.77.0.1/24"] and _mn0(peer) == ["10.77.0.2/24"]
    r = peer.run(["python3", "-c", "import socket; s=socket.socket(); s.settimeout(5); "
                  "print(s.connect_ex(('10.77.0.1', 9)))"], timeout=60, check=True)
    assert r.out.strip() == "111"  # ECONNREFUSED: the head answered (a RST), over the new bridge


@pytest.mark.lab
def test_down_removes_the_namespace_and_veths(lab_pair: PairInfo, _lab_manager):
    pair = Pair(_lab_manager)
    pair.down()
    assert netns.status() == {"netns": "dfo-lab-mn", "up": False}
    assert not Path("/run/netns/dfo-lab-mn").exists()
    assert netns.host_view() == {"interfaces": [], "addresses": [], "routes": []}
    assert set(pair.status()["containers"].values()) == {"STOPPED"}
    pair.up()  # and up again from nothing
    assert netns.status()["ports"] == ["dfo202br", "dfo203br"]


# ---------------------------------------------------------------- no root needed
def _info(keys: str = "/k") -> PairInfo:
    lab = LabInfo(ssh_host="127.0.0.1", ssh_port=2222, ssh_user="root", identity_file=f"{keys}/id",
                  known_hosts=f"{keys}/kh", ssh_config="/k/cfg", host_public_key="ssh-ed25519 AAAA",
                  vmid=None, container_name=None, wheelhouse_host_dir="/w",
                  wheelhouse_container_dir="/mnt/wheelhouse",
                  state_dir="/s", bin_dir="/s/bin")
    return PairInfo(lab=lab)


def test_hosts_yaml_names_both_containers_and_the_group():
    doc = yaml.safe_load(_info().hosts_yaml(roots=("/root/a", "/root/b"), wheelhouse=True))
    assert doc["default"] == "lab-a"
    assert {n: (h["transport"], h["vmid"], h["root"], h["wheelhouse"]) for n, h in doc["hosts"].items()} == {
        "lab-a": ("proxmox", 202, "/root/a", "/mnt/wheelhouse"),
        "lab-b": ("proxmox", 203, "/root/b", "/mnt/wheelhouse")}
    assert doc["hosts"]["lab-a"]["ssh"] == {"host": "127.0.0.1", "port": 2222, "user": "root",
                                            "identity_file": "/k/id", "known_hosts": "/k/kh"}
    assert doc["groups"] == {"pair": {"hosts": ["lab-a", "lab-b"], "head_addr": "10.77.0.1",
                                      "port": 29400, "ifname": "mn0"}}
    assert "ifname" not in yaml.safe_load(_info().hosts_yaml(ifname=False))["groups"]["pair"]
    assert "groups" not in yaml.safe_load(_info().hosts_yaml(groups=False))


def test_hosts_yaml_without_groups_loads_as_an_inventory(tmp_path):
    for f in ("id", "kh"):
        (tmp_path / f).write_text("")
    p = tmp_path / "hosts.yaml"
    p.write_text(_info(str(tmp_path)).hosts_yaml(groups=False))
    inv = load_inventory(str(p))
    a, b = inv.get("lab-a"), inv.get("lab-b")
    assert (a.transport, a.vmid, b.transport, b.vmid) == ("proxmox", 202, "proxmox", 203)


def test_net_lines_hand_the_veth_end_to_lxc_as_phys():
    assert net_lines(202, "10.77.0.1") == [
        "lxc.net.1.type = phys", "lxc.net.1.link = dfo202ct", "lxc.net.1.name = mn0",
        "lxc.net.1.ipv4.address = 10.77.0.1/24", "lxc.net.1.flags = up"]
    assert all(len(n) <= 15 for n in netns.veth_names(999999999))  # IFNAMSIZ
    # Lab.release/down tear the namespace down only for a state dir whose containers use it
    cfg = "lxc.net.0.type = empty\n" + "\n".join(net_lines(202, "10.77.0.1"))
    assert netns.uses_pair_net(cfg, 202) and not netns.uses_pair_net(cfg, 203)
    assert not netns.uses_pair_net("lxc.net.0.type = empty\n", 200)


def test_missing_iproute2_is_one_line_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabUnavailable) as ei:
        netns.preflight()
    assert str(ei.value) == "the pair network needs iproute2: apt-get install -y iproute2"
