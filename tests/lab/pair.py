"""Two lab containers that reach each other over the pair network (tests/lab/netns.py):
``dfo-lab-202`` (the head, 10.77.0.1) and ``dfo-lab-203`` (10.77.0.2), both built
like container 200 (same template cache, the same read-only wheelhouse mount),
each with ``mn0`` on br0 inside the lab's network namespace ``dfo-lab-mn``.

Both are reached as Proxmox guests through the lab's sshd node and ``pct exec``,
exactly like container 200. ``Pair(lab).up()`` is idempotent: it builds what is
missing, (re)makes the namespace, bridge and veth pairs that are missing or
broken, rewrites the managed LXC config, and (re)starts a container whose network
is not right; when everything is up it only looks (a few ``ip`` calls).
``Lab.release`` (last holder out) and ``Lab.down`` stop the containers and delete
the namespace; a killed run leaves at most a namespace that the next ``up`` reuses.

The containers do not resolve each other's names (no DNS; /etc/hosts knows only
itself): whatever dials the head must use its address (torchrun --local-addr).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import netns
from .container import Container
from .lab import Lab, LabInfo
from .procs import file_lock

PAIR_VMIDS = (202, 203)
PAIR_ADDRS = ("10.77.0.1", "10.77.0.2")
HOST_NAMES = ("lab-a", "lab-b")
GROUP = "pair"
RDZV_PORT = 29400  # torchrun c10d rendezvous; dfo's coordination store uses port+1
_IFNAME, _NETNS, _BRIDGE, _PREFIXLEN = netns.IFNAME, netns.NETNS, netns.BRIDGE, netns.PREFIXLEN


@dataclass(frozen=True)
class PairInfo:
    lab: LabInfo  # the sshd node (vmid None: container 200 is not part of the pair)
    vmids: tuple[int, int] = PAIR_VMIDS
    addresses: tuple[str, str] = PAIR_ADDRS  # on the bridge; [0] is the head
    ifname: str = _IFNAME  # inside both containers
    netns: str = _NETNS
    bridge: str = _BRIDGE
    prefixlen: int = _PREFIXLEN
    host_names: tuple[str, str] = HOST_NAMES
    group: str = GROUP
    port: int = RDZV_PORT
    timings: dict = field(default_factory=dict, compare=False)

    @property
    def head_addr(self) -> str:
        return self.addresses[0]

    def container_name(self, i: int) -> str:
        return f"dfo-lab-{self.vmids[i]}"

    def hosts_yaml(self, root: str = "/root/dfo", *, roots: tuple[str, str] | None = None,
                   groups: bool = True, ifname: bool = True, profile: str = "cpu",
                   wheelhouse: bool = False, port: int | None = None) -> str:
        """hosts.yaml text: ``lab-a`` (202, the head) and ``lab-b`` (203), both
        proxmox guests of the lab node, and (``groups=True``) the group ``pair``
        with head_addr, port and (``ifname=True``) ifname. ``roots`` gives each
        host its own root (default: ``root`` for both; they are separate
        containers)."""
        roots = roots or (root, root)
        out = [f"default: {self.host_names[0]}", "hosts:"]
        for name, vmid, r in zip(self.host_names, self.vmids, roots, strict=True):
            out += [f"  {name}:",
                    "    transport: proxmox",
                    f"    ssh: {self.lab.ssh_yaml()}",
                    f"    vmid: {vmid}",
                    f"    root: {r}",
                    f"    profile: {profile}",
                    "    gpus: {target: [cpu], drafter: [cpu]}"]
            if wheelhouse:
                out.append(f"    wheelhouse: {self.lab.wheelhouse_container_dir}")
        if groups:
            out += ["groups:",
                    f"  {self.group}:",
                    f"    hosts: [{', '.join(self.host_names)}]",
                    f"    head_addr: {self.head_addr}",
                    f"    port: {self.port if port is None else port}"]
            if ifname:
                out.append(f"    ifname: {self.ifname}")
        return "\n".join(out) + "\n"


class Pair:
    def __init__(self, lab: Lab, vmids: tuple[int, int] = PAIR_VMIDS,
                 addresses: tuple[str, str] = PAIR_ADDRS):
        self.lab = lab
        self.vmids = tuple(int(v) for v in vmids)
        self.addresses = tuple(addresses)
        self.lock = lab.state_dir / "pair.lock"  # held by a test that uses the pair (conftest)

    def containers(self) -> list[Container]:
        return [Container(v, wheelhouse=self.lab.wheelhouse, log_dir=self.lab.logs,
                          net=net_lines(v, a))
                for v, a in zip(self.vmids, self.addresses, strict=True)]

    def up(self, *, lease: str | None = None) -> PairInfo:
        """The sshd node (a lease, like Lab.up) and both containers on the pair network."""
        node = self.lab.up(container=False, lease=lease)
        timings = dict(node.timings)
        with file_lock(self.lab.lock):
            netns.preflight()
            t0 = time.monotonic()
            for ct in self.containers():
                self.lab._own(ct)
                report = ct.build()
                if report.built:
                    timings[f"build_{ct.vmid}_s"] = round(report.seconds, 1)
            t1 = time.monotonic()
            netns.ensure_bridge()
            for ct in self.containers():
                self._member_up(ct)
            timings["pair_net_and_start_s"] = round(time.monotonic() - t1, 3)
            timings["pair_total_s"] = round(time.monotonic() - t0, 3)
        return PairInfo(lab=node, vmids=self.vmids, addresses=self.addresses, timings=timings)

    def down(self) -> None:
        """Stop both containers and delete the namespace (the containers stay built)."""
        with file_lock(self.lab.lock):
            for ct in self.containers():
                ct.stop()
            netns.teardown(list(self.vmids))

    def status(self) -> dict:
        return {"containers": {ct.name: ct.state() for ct in self.containers()},
                "network": netns.status()}

    # -------------------------------------------------------------- helpers
    def _member_up(self, ct: Container) -> None:
        changed = ct.configure()
        if ct.running() and (changed or not netns.veth_ready(ct.vmid, running=True)):
            ct.stop()  # a config from before, or its veth pair is gone: start it afresh
        if not ct.running():
            netns.ensure_veth(ct.vmid)
            ct.start()


def net_lines(vmid: int, address: str) -> list[str]:
    """The container's managed lxc.net.1 lines: the veth end as a phys device."""
    ct_end, _ = netns.veth_names(vmid)
    return ["lxc.net.1.type = phys",
            f"lxc.net.1.link = {ct_end}",
            f"lxc.net.1.name = {netns.IFNAME}",
            f"lxc.net.1.ipv4.address = {address}/{netns.PREFIXLEN}",
            "lxc.net.1.flags = up"]
