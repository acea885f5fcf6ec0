"""The quoting property test through the real path: local -> ssh (sshd's login shell) ->
pct exec -> lxc-attach -> the container. Arbitrary arguments must arrive byte-for-byte
and never be evaluated by a shell on the way. One connection for all examples."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config.inventory import load_inventory
from orchestrator.transport import open_transport

pytestmark = pytest.mark.lab

ECHO = ["python3", "-c", "import sys,json;print(json.dumps(sys.argv[1:]))"]
PWNED = "/tmp/dfo-quoting-pwned"
AWKWARD = ["fil () &&-@_e.txt", f"$(touch {PWNED})", f"`touch {PWNED}`", f"; touch {PWNED}",
           f"\ntouch {PWNED}\n", "*", "/*", "~root", "'\"'\"", "A=1", "-c", "--", "", " ", "\t",
           "$HOME", "${PATH}", "\\\\n", "!!", "#", "ünïcödé ☃ 𝄞", "%s%n", "a\rb", "\x1b[31m"]
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
ARGS = st.lists(st.one_of(ARG, st.sampled_from(AWKWARD)), max_size=8)


@pytest.fixture(scope="module")
def transports(lab, tmp_path_factory):
    d = tmp_path_factory.mktemp("quoting")
    hosts = d / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root="/root/dfo"))
    inv = load_inventory(str(hosts))
    ct = open_transport(inv.get("lab"))
    node = open_transport(inv.get("lab-node"))
    for t in (ct, node):
        t.run(["rm", "-f", PWNED], check=True)
    yield ct, node
    try:
        assert ct.conn.connects == 1 and node.conn.connects == 1  # one connection each, reused
        for t in (ct, node):
            assert t.run(["test", "-e", PWNED]).exit_code == 1, "an argument was evaluated by a shell"
    finally:
        ct.close()
        node.close()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=ARGS, env_value=st.one_of(st.none(), ARG))
def test_args_arrive_byte_for_byte_in_the_container(transports, args, env_value):
    ct, _ = transports
    env = None if env_value is None else {"DFO_Q": env_value}
    code = "import os,sys,json;print(json.dumps([os.environ.get('DFO_Q'), sys.argv[1:]]))"
    r = ct.run(["python3", "-c", code, *args], env=env)
    assert r.exit_code == 0, r.err
    assert json.loads(r.out) == [env_value, args]


def test_awkward_args_on_node_and_container(transports):
    for t in transports:
        r = t.run(ECHO + AWKWARD, cwd="/")
        assert r.exit_code == 0, r.err
        assert json.loads(r.out) == AWKWARD
        assert t.run(["test", "-e", PWNED]).exit_code == 1
