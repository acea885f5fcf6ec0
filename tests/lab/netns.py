"""The pair network: a bridge inside a network namespace the lab creates, and one
veth pair per container, so that two lab containers reach each other while no
packet ever passes through this machine's own network namespace.

::

    netns dfo-lab-mn:   br0 ── dfo202br ═╗        ╔═ dfo203br ── br0
                                         ║ veth   ║ veth
    container 202 netns:  mn0 10.77.0.1 ═╝        ╚═ mn0 10.77.0.2  :container 203 netns

Each veth pair is made with its ``...br`` end in the namespace (on br0) and its
``...ct`` end in the host namespace, where LXC picks it up as a ``phys`` device
(``lxc.net.1.type = phys``), renames it ``mn0``, gives it the address and moves
it into the container's namespace. While the container runs, the host namespace
holds no lab interface at all; when the container stops LXC hands the ``...ct``
end back to the host namespace (no address, down), where the next start picks it
up again. Deleting the namespace deletes the bridge and every veth pair, both ends.

Namespaces are entered only by ``ip -n NS`` (one ip command), never by running
LXC tools under ``ip netns exec`` (it remounts /sys and breaks lxc-start).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from .sshd import LabUnavailable

NETNS = "dfo-lab-mn"
BRIDGE = "br0"
IFNAME = "mn0"  # the interface name inside the containers (GLOO_SOCKET_IFNAME)
PREFIXLEN = 24
SUBNET = "10.77.0.0/24"
_CT_END = re.compile(r"^dfo\d{3,9}ct$")  # our host-side veth ends, and only ours


def veth_names(vmid: int) -> tuple[str, str]:
    """(container end, bridge end) of the veth pair of ``vmid``; at most 14 chars."""
    return f"dfo{int(vmid)}ct", f"dfo{int(vmid)}br"


def ip(*args: str, netns: str | None = None, check: bool = True,
       json_out: bool = False) -> subprocess.CompletedProcess | list:
    """Run one ``ip`` command (``ip -n NETNS`` when given). With json_out: the parsed -j output."""
    argv = ["ip"] + (["-n", netns] if netns else []) + (["-j"] if json_out else []) + list(args)
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise LabUnavailable(f"{' '.join(argv)} failed: {p.stderr.strip() or p.returncode}")
    if json_out:
        return json.loads(p.stdout or "[]") if p.returncode == 0 else []
    return p


def preflight() -> None:
    if not shutil.which("ip"):
        raise LabUnavailable("the pair network needs iproute2: apt-get install -y iproute2")


def netns_exists() -> bool:
    if not Path(f"/run/netns/{NETNS}").exists():
        return False
    return ip("link", "show", "lo", netns=NETNS, check=False).returncode == 0


def links(netns: str | None = None) -> dict[str, dict]:
    """{ifname: ip -j link entry} of a namespace (the host's when None)."""
    return {d["ifname"]: d for d in ip("link", "show", netns=netns, json_out=True)}


def ensure_bridge() -> bool:
    """The namespace with br0 up (and lo up). True when something was (re)made."""
    preflight()
    made = False
    if not netns_exists():
        ip("netns", "del", NETNS, check=False)  # a stale mount point of a half-made one
        ip("netns", "add", NETNS)
        made = True
    have = links(NETNS)
    if BRIDGE not in have:
        ip("link", "add", BRIDGE, "type", "bridge", netns=NETNS)
        made = True
    if "UP" not in have.get(BRIDGE, {}).get("flags", []):
        ip("link", "set", BRIDGE, "up", netns=NETNS)
    if "UP" not in have.get("lo", {}).get("flags", []):
        ip("link", "set", "lo", "up", netns=NETNS)
    return made


def veth_ready(vmid: int, *, running: bool) -> bool:
    """The bridge end is on br0 and up; the container end is in the host namespace
    (a stopped container) or absent from it (moved into the running container)."""
    ct_end, br_end = veth_names(vmid)
    br = links(NETNS).get(br_end)
    if not br or br.get("master") != BRIDGE or "UP" not in br.get("flags", []):
        return False
    in_host = ct_end in links()
    return not in_host if running else in_host


def ensure_veth(vmid: int) -> bool:
    """For a stopped container: its veth pair, bridge end on br0, container end in
    the host namespace. Reuses a good pair; remakes a broken one. True when made."""
    if veth_ready(vmid, running=False):
        return False
    ct_end, br_end = veth_names(vmid)
    ip("link", "del", ct_end, check=False)
    ip("link", "del", br_end, netns=NETNS, check=False)
    ip("link", "add", ct_end, "type", "veth", "peer", "name", br_end, "netns", NETNS)
    ip("link", "set", br_end, "master", BRIDGE, "up", netns=NETNS)
    return True


def uses_pair_net(config_text: str, vmid: int) -> bool:
    """Whether an LXC config hands ``vmid``'s veth end to its container (tests/lab/pair.py)."""
    return f"= {veth_names(vmid)[0]}" in config_text


def teardown(vmids: list[int] | None = None) -> list[str]:
    """Delete the namespace (br0 and every veth pair go with it) and the container
    ends of ``vmids`` (default: any of ours) left in the host namespace. Call it
    after stopping the containers. Returns what was removed."""
    removed = []
    if Path(f"/run/netns/{NETNS}").exists():
        ip("netns", "del", NETNS, check=False)
        removed.append(f"netns {NETNS}")
    if shutil.which("ip"):
        wanted = None if vmids is None else {veth_names(v)[0] for v in vmids}
        for name in links():
            if _CT_END.match(name) and (wanted is None or name in wanted):
                ip("link", "del", name, check=False)
                removed.append(name)
    return removed


def host_view() -> dict:
    """What the host namespace has of the pair network (for assertions): our
    interfaces, its IPv4 addresses in SUBNET, its routes into SUBNET."""
    import ipaddress

    net = ipaddress.ip_network(SUBNET)
    ours = sorted(n for n in links() if _CT_END.match(n) or n == BRIDGE)
    addrs = [f"{a['local']}/{a['prefixlen']} dev {d['ifname']}"
             for d in ip("-4", "addr", "show", json_out=True) for a in d.get("addr_info", [])
             if ipaddress.ip_address(a["local"]) in net]
    routes = []
    for r in ip("-4", "route", "show", "table", "all", json_out=True):
        dst = r.get("dst", "")
        if dst in ("default", ""):
            continue
        try:
            if ipaddress.ip_network(dst, strict=False).overlaps(net):
                routes.append(f"{dst} dev {r.get('dev')}")
        except ValueError:
            continue
    return {"interfaces": ours, "addresses": addrs, "routes": routes}


def status() -> dict:
    if not shutil.which("ip") or not netns_exists():
        return {"netns": NETNS, "up": False}
    have = links(NETNS)
    return {"netns": NETNS, "up": BRIDGE in have,
            "ports": sorted(n for n, d in have.items() if d.get("master") == BRIDGE)}
