"""``groups:`` of hosts.yaml: hosts that form one multi-node job (docs/hosts.md, mn design).

Called by the inventory parser once ``hosts:`` is read, with the same ``NodeReader``,
so every error is one line naming the file and line:
``hosts.yaml:41: groups.pair.hosts[1]: unknown host 'gpu3' (did you mean 'gpu2'?)``.

What is checked here is what the file alone can tell: known hosts, no host twice (in one
group or in two), at least two hosts, one profile for all members, the head address's
syntax, the port range, per-host device lists. Whether the head address is reachable is a
runtime question (``dfo hosts check --group``).
"""

from __future__ import annotations

import ipaddress
import re
import yaml

from .hostconfig import GroupConfig, HostConfig, did_you_mean
from .yaml_nodes import NodeReader

_GROUP_KEYS = ("hosts", "head_addr", "port", "gpus", "ifname")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: one process's device: ``cuda:N`` (an index: each process needs its own GPU) or ``cpu``
_NODE_DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")
_HOSTNAME_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
#: ports: not privileged, and ``port + 1`` (the coordination store) must exist too
PORT_MIN, PORT_MAX = 1024, 65534


def head_addr_problem(addr: str) -> str | None:
    """Why ``addr`` is not an IP address or a DNS name (None: it is one)."""
    if "://" in addr or "/" in addr:
        return "expected an IP address or a host name, not a URL or path"
    if addr.count(":") == 1 or (addr.startswith("[") and "]:" in addr):
        return "expected an address without a port (put the port in `port:`)"
    try:
        ipaddress.ip_address(addr.strip("[]"))
        return None
    except ValueError:
        pass
    if ":" in addr:
        return "not a valid IPv6 address"
    if re.fullmatch(r"[\d.]+", addr):
        return "not a valid IPv4 address"
    name = addr[:-1] if addr.endswith(".") else addr
    if len(name) > 253 or not all(_HOSTNAME_LABEL.match(lbl) for lbl in name.split(".")):
        return "expected an IP address or a host name (letters, digits, '-' and '.')"
    return None


def parse_groups(p: NodeReader, node: yaml.Node, hosts: dict[str, HostConfig]) -> dict[str, GroupConfig]:
    """``groups:`` as {name: GroupConfig}; ``hosts`` are the already-validated hosts."""
    if isinstance(node, yaml.ScalarNode) and p.scalar(node) is None:
        return {}  # `groups:` with nothing under it
    gmap = p.mapping(node, "groups", None)
    out: dict[str, GroupConfig] = {}
    member_of: dict[str, tuple[str, int]] = {}  # host -> (group, line) of its first group
    for name, (knode, vnode) in gmap.items():
        if not _NAME_RE.match(name):
            raise p.err(knode, f"groups.{name}", "a group name may hold only letters, digits, '.', "
                                                  "'_' and '-' and must start with a letter or digit")
        if name in hosts:
            raise p.err(knode, f"groups.{name}", f"{name!r} is already a host's name; give the "
                                                  f"group another name (commands take --host or --group)")
        g = _group(p, name, knode, vnode, hosts)
        m = p.mapping(vnode, f"groups.{name}", _GROUP_KEYS)
        hnode = m["hosts"][1]
        for i, h in enumerate(g.hosts):
            if h in member_of:
                other, line = member_of[h]
                raise p.err(hnode.value[i] if isinstance(hnode, yaml.SequenceNode) else hnode,
                            f"groups.{name}.hosts[{i}]",
                            f"host {h!r} is already in group {other!r} (line {line}); a host "
                            f"belongs to one group (its run dir and ports are the group's)")
            member_of[h] = (name, knode.start_mark.line + 1)
        out[name] = g
    return out


def _group(p: NodeReader, name: str, knode: yaml.Node, node: yaml.Node,
           hosts: dict[str, HostConfig]) -> GroupConfig:
    w = f"groups.{name}"
    m = p.mapping(node, w, _GROUP_KEYS)
    if "hosts" not in m:
        raise p.err(knode, f"{w}.hosts", "missing: the group's hosts, the head first "
                                         "(e.g. `hosts: [gpu1, gpu2]`)")
    hnode = m["hosts"][1]
    if not isinstance(hnode, yaml.SequenceNode):
        raise p.err(hnode, f"{w}.hosts", f"expected a list of host names, got {p.describe(hnode)}")
    members: list[str] = []
    for i, item in enumerate(hnode.value):
        h = p.string(item, f"{w}.hosts[{i}]")
        if h not in hosts:
            raise p.err(item, f"{w}.hosts[{i}]", f"unknown host {h!r}{did_you_mean(h, hosts)}; "
                                                 f"hosts: {', '.join(hosts)}")
        if h in members:
            raise p.err(item, f"{w}.hosts[{i}]", f"host {h!r} is listed twice (it is "
                                                 f"hosts[{members.index(h)}]); list each host once")
        members.append(h)
    if len(members) < 2:
        raise p.err(hnode, f"{w}.hosts", f"a group needs at least 2 hosts, got {len(members)} "
                                         f"(one host needs no group: use --host)")
    head_prof = hosts[members[0]].profile
    for i, h in enumerate(members[1:], start=1):
        if hosts[h].profile != head_prof:
            raise p.err(hnode.value[i], f"{w}.hosts[{i}]",
                        f"host {h!r} has profile {hosts[h].profile!r} but the head "
                        f"{members[0]!r} has {head_prof!r}; every member runs the same env "
                        f"(set one `profile:` on all of them)")

    if "head_addr" not in m:
        raise p.err(knode, f"{w}.head_addr", f"missing: the address the other hosts reach "
                                             f"{members[0]} (the head) on (e.g. `head_addr: 10.0.0.1`)")
    anode = m["head_addr"][1]
    v = p.scalar(anode) if isinstance(anode, yaml.ScalarNode) else None
    addr = str(anode.value) if isinstance(v, (int, float)) and not isinstance(v, bool) else \
        p.string(anode, f"{w}.head_addr")
    problem = head_addr_problem(addr)
    if problem:
        raise p.err(anode, f"{w}.head_addr", f"{problem}, got {addr!r}")

    kw: dict = {}
    if "port" in m:
        kw["port"] = p.integer(m["port"][1], f"{w}.port", lo=PORT_MIN, hi=PORT_MAX)
    if "gpus" in m:
        kw["gpus"] = _gpus(p, m["gpus"][1], f"{w}.gpus", members)
    if "ifname" in m:
        inode = m["ifname"][1]
        ifname = p.string(inode, f"{w}.ifname")
        if not _IFNAME_RE.match(ifname):
            raise p.err(inode, f"{w}.ifname", f"expected a network interface name like eth1 "
                                              f"(at most 15 characters, no spaces or '/'), got {ifname!r}")
        kw["ifname"] = ifname
    return GroupConfig(name=name, hosts=tuple(members), head_addr=addr.strip("[]"),
                       source=p.src(knode), **kw)


def _gpus(p: NodeReader, node: yaml.Node, where: str, members: list[str]) -> dict[str, tuple[str, ...]]:
    m = p.mapping(node, where, None)
    out: dict[str, tuple[str, ...]] = {}
    for h, (knode, vnode) in m.items():
        if h not in members:
            raise p.err(knode, f"{where}.{h}", f"{h!r} is not in this group{did_you_mean(h, members)}; "
                                               f"members: {', '.join(members)}")
        devs = p.string_list(vnode, f"{where}.{h}")
        if not devs:
            raise p.err(vnode, f"{where}.{h}", "expected at least one device (e.g. [cuda:0, cuda:1])")
        for i, d in enumerate(devs):
            if not _NODE_DEVICE_RE.match(d):
                raise p.err(vnode, f"{where}.{h}[{i}]", f"expected a device like cuda:0 "
                                                        f"(one process each) or cpu, got {d!r}")
        kinds = {d.split(":")[0] for d in devs}
        if len(kinds) > 1:
            raise p.err(vnode, f"{where}.{h}", f"mixes cpu and cuda devices: {list(devs)} "
                                               f"(a node's processes all use one kind)")
        cuda = [d for d in devs if d != "cpu"]
        if len(set(cuda)) != len(cuda):
            raise p.err(vnode, f"{where}.{h}", f"lists a device twice: {list(devs)}")
        out[h] = devs
    return out
