"""`dfo launch/status/logs/stop --group` through the real CLI on two `transport: local`
hosts with their own roots (loopback, CPU)."""

from __future__ import annotations

import fcntl
import json

import pytest

from orchestrator.cli import main
from tests.supervisor_env import tiny_assets, write_config  # noqa: F401,F811
from tests.test_group_runs_local import env_root, free_port


def dfo(capsys, hosts, *args):
    rc = main(["--hosts", str(hosts), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def group_yaml(tmp_path, envs=(True, True)):
    roots = [env_root(tmp_path, n, None, e) for n, e in zip(("a", "b"), envs)]
    p = tmp_path / "hosts.yaml"
    p.write_text(f"""default: a
hosts:
  a:
    transport: local
    root: {roots[0]}
  b:
    transport: local
    root: {roots[1]}
groups:
  pair:
    hosts: [a, b]
    head_addr: 127.0.0.1
    port: {free_port()}
    ifname: lo
""")
    return p, roots


@pytest.mark.parametrize("cmd", [["launch"], ["logs"], ["status"], ["stop"]])
def test_group_and_host_together_is_one_line_exit_2(tmp_path, capsys, cmd):
    p, _ = group_yaml(tmp_path)
    rc, out, err = dfo(capsys, p, *cmd, "--group", "pair", "--host", "a")
    assert rc == 2 and err.startswith("dfo: error: --group and --host cannot be combined")
    assert err.count("\n") == 1
