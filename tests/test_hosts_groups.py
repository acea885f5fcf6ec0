"""``groups:`` in hosts.yaml: parsed into Inventory.groups; every bad input is one line with
file:line (exit 2 through the CLI)."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.config.groups_parser import head_addr_problem
from orchestrator.config.inventory import parse_inventory
from orchestrator.common.errors import ConfigError

HOSTS = """\
hosts:
  gpu1: {transport: local, root: /tmp/g1, profile: cpu}
  gpu2: {transport: local, root: /tmp/g2, profile: cpu}
  gpu3: {transport: local, root: /tmp/g3, profile: cpu}
  odd: {transport: local, root: /tmp/g4, profile: cuda}
"""


def parse(groups: str):
    return parse_inventory(HOSTS + textwrap.dedent(groups), "hosts.yaml")


def error(groups: str) -> str:
    with pytest.raises(ConfigError) as ei:
        parse(groups)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("hosts.yaml:"), msg
    return msg


def test_full_group_parsed():
    inv = parse("""\
        groups:
          pair:
            hosts: [gpu1, gpu2]
            head_addr: 10.0.0.1
            port: 29500
            gpus: {gpu2: [cuda:0, cuda:1]}
            ifname: eth1
        """)
    g = inv.group("pair")
    assert g.hosts == ("gpu1", "gpu2") and g.head == "gpu1"
    assert g.head_addr == "10.0.0.1" and g.port == 29500 and g.coord_port == 29501
    assert dict(g.gpus) == {"gpu2": ("cuda:0", "cuda:1")} and g.ifname == "eth1"
    assert g.source == "hosts.yaml:7"


def test_defaults_and_empty_groups():
    g = parse("groups:\n  p: {hosts: [gpu2, gpu1], head_addr: head.example}\n").group("p")
    assert g.head == "gpu2" and g.port == 29400 and g.ifname is None and not g.gpus
    assert parse("groups:\n").groups == {}
    assert parse_inventory(HOSTS, "hosts.yaml").groups == {}


@pytest.mark.parametrize("addr", ["10.0.0.1", "127.0.0.1", "::1", "[fe80::1]", "gpu1",
                                  "node-1.lab.example", "head.example."])
def test_head_addr_good(addr):
    assert head_addr_problem(addr) is None


@pytest.mark.parametrize("addr,why", [
    ("10.0.0.300", "IPv4"), ("10.0.0.1:29400", "without a port"), ("http://x", "URL"),
    ("a b", "host name"), ("-bad.example", "host name"), ("1::2::3", "IPv6"),
    ("[::1]:80", "without a port"), ("under_score", "host name")])
def test_head_addr_bad(addr, why):
    assert why in head_addr_problem(addr)


@pytest.mark.parametrize("groups,line,expect", [
    ("groups:\n  pair: {hosts: [gpu1, gpu22], head_addr: 10.0.0.1}\n", 7,
     "groups.pair.hosts[1]: unknown host 'gpu22' (did you mean 'gpu2'?)"),
    ("groups:\n  pair:\n    hosts:\n      - gpu1\n      - gpu4\n    head_addr: 10.0.0.1\n", 10,
     "groups.pair.hosts[1]: unknown host 'gpu4'"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: h}\n  b: {hosts: [gpu3, gpu2], head_addr: h}\n", 8,
     "groups.b.hosts[1]: host 'gpu2' is already in group 'a' (line 7)"),
    ("groups:\n  a: {hosts: [gpu1], head_addr: h}\n", 7, "at least 2 hosts, got 1"),
    ("groups:\n  a: {hosts: [], head_addr: h}\n", 7, "at least 2 hosts, got 0"),
    ("groups:\n  a: {hosts: [gpu1, gpu1], head_addr: h}\n", 7, "hosts[1]: host 'gpu1' is listed twice"),
    ("groups:\n  a: {hosts: [gpu1, odd], head_addr: h}\n", 7,
     "host 'odd' has profile 'cuda' but the head 'gpu1' has 'cpu'"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: 10.0.0.256}\n", 7,
     "groups.a.head_addr: not a valid IPv4 address, got '10.0.0.256'"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: 'h:29400'}\n", 7, "put the port in `port:`"),
    ("groups:\n  a: {hosts: [gpu1, gpu2]}\n", 7, "groups.a.head_addr: missing"),
    ("groups:\n  a: {head_addr: h}\n", 7, "groups.a.hosts: missing"),
    ("groups:\n  a: {hosts: gpu1, head_addr: h}\n", 7, "expected a list of host names"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: h, port: 80}\n", 7,
     "groups.a.port: expected an integer between 1024 and 65534, got 80"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: h, port: 65535}\n", 7, "got 65535"),
    ("groups:\n  a: {hosts: [gpu1, gpu2], head_addr: h, port: x}\n", 7, "expected an integer"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu3: [cuda:0]}\n", 10,
     "groups.a.gpus.gpu3: 'gpu3' is not in this group"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu2: [cuda]}\n", 10,
     "groups.a.gpus.gpu2[0]: expected a device like cuda:0"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu2: [gpu0]}\n", 10,
     "got 'gpu0'"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu2: [cuda:0, cuda:0]}\n", 10,
     "lists a device twice"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu2: []}\n", 10,
     "expected at least one device"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    gpus: {gpu2: [cpu, cuda:0]}\n", 10,
     "mixes cpu and cuda"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    ifname: 'eth 1'\n", 10,
     "groups.a.ifname: expected a network interface name"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: h\n    hostz: []\n", 10,
     "groups.a.hostz: unknown key (did you mean 'hosts'?)"),
    ("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    hosts: [gpu1, gpu3]\n    head_addr: h\n", 9,
     "groups.a.hosts: duplicate key"),
    ("groups:\n  gpu1: {hosts: [gpu2, gpu3], head_addr: h}\n", 7, "already a host's name"),
    ("groups:\n  'bad name': {hosts: [gpu2, gpu3], head_addr: h}\n", 7, "a group name may hold only"),
    ("groups: [a, b]\n", 6, "groups: expected a mapping"),
    ("groups:\n  a: 3\n", 7, "groups.a: expected a mapping"),
])
def test_group_errors(groups, line, expect):
    msg = error(groups)
    assert msg.startswith(f"hosts.yaml:{line}: "), msg
    assert expect in msg, msg


def test_cpu_repeated_is_several_cpu_processes():
    g = parse("groups:\n  a:\n    hosts: [gpu1, gpu2]\n    head_addr: 127.0.0.1\n"
              "    gpus: {gpu1: [cpu, cpu]}\n").group("a")
    assert g.gpus["gpu1"] == ("cpu", "cpu")


def test_unknown_group_lookup():
    inv = parse("groups:\n  pair: {hosts: [gpu1, gpu2], head_addr: h}\n")
    with pytest.raises(ConfigError, match="did you mean 'pair'"):
        inv.group("pari")


def test_repo_hosts_yaml_example_parses():
    """The commented example in the repo's hosts.yaml, uncommented, is valid."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "hosts.yaml").read_text()
    block = text[text.index("# groups:"):]
    lines = []
    for ln in block.splitlines():
        if not ln.startswith("#"):
            break
        lines.append(ln[2:] if ln.startswith("# ") else ln[1:])
    groups = "\n".join(lines) + "\n"
    inv = parse_inventory(HOSTS.replace("gpu1", "node1").replace("gpu2", "node2") +
                          groups.replace("gpu1", "node1").replace("gpu2", "node2"), "hosts.yaml")
    assert inv.groups
