"""The host-key hints name a command that works: for an unknown or changed *jump host*
key the hint is `dfo hosts trust jumped` (which walks the jump hosts first), not
`dfo hosts trust jumped (jump host 127.0.0.1)`, which is not a command. Parsed by click
here, and run against the lab's real sshd in the lab test."""

from __future__ import annotations

import json
import re
import shlex

import click
import paramiko
import pytest

from orchestrator.common.errors import HostKeyError
from orchestrator.transport.settings import SSHSettings
from orchestrator.transport.ssh_errors import RefuseUnknown, translate


def _command(msg: str) -> list[str]:
    cmds = re.findall(r"`([^`]*)`", msg)
    assert len(cmds) == 1, msg
    return shlex.split(cmds[0])


def _parses(argv: list[str]) -> click.Context:
    """argv (after `dfo`) as the real CLI parses it; returns the leaf command's context."""
    from orchestrator.cli import cli

    assert argv[:1] == ["dfo"]
    cmd, rest, parent = cli, argv[1:], None
    while isinstance(cmd, click.Group):
        parent = click.Context(cmd, info_name=cmd.name, parent=parent)
        sub = cmd.get_command(parent, rest[0])
        assert sub is not None, f"no command {rest[0]!r} in {argv}"
        cmd, rest = sub, rest[1:]
    return cmd.make_context(cmd.name, rest, parent=parent)


def test_unknown_jump_host_hint_is_a_real_command():
    key = paramiko.ECDSAKey.generate()
    pol = RefuseUnknown("jumped (jump host 127.0.0.1)", "/kh", trust_as="jumped")
    with pytest.raises(HostKeyError) as e:
        pol.missing_host_key(None, "[127.0.0.1]:2222", key)
    msg = str(e.value)
    assert "host key of jumped (jump host 127.0.0.1)" in msg
    argv = _command(msg)
    assert argv == ["dfo", "hosts", "trust", "jumped"]
    ctx = _parses(argv)
    assert ctx.command.name == "trust" and ctx.params["name"] == "jumped"
    # a direct host: unchanged
    with pytest.raises(HostKeyError) as e:
        RefuseUnknown("pve", "/kh").missing_host_key(None, "pve", key)
    assert _command(str(e.value)) == ["dfo", "hosts", "trust", "pve"]


def test_changed_jump_host_hint_is_a_real_command():
    new, old = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    err = translate(paramiko.BadHostKeyException("127.0.0.1", new, old), "jumped (jump host 127.0.0.1)",
                    SSHSettings(host="127.0.0.1"), "jumped")
    assert isinstance(err, HostKeyError) and "REMOTE HOST KEY CHANGED for jumped (jump host" in str(err)
    argv = _command(str(err))
    assert argv == ["dfo", "hosts", "trust", "jumped", "--replace"]
    ctx = _parses(argv)
    assert ctx.params["name"] == "jumped" and ctx.params["replace"] is True


@pytest.mark.lab
def test_lab_jump_host_hint_pasted_trusts_and_connects(lab, tmp_path, capsys):
    from orchestrator.cli import main
    from orchestrator.config.inventory import load_inventory
    from orchestrator.transport import open_transport

    kh = tmp_path / "known_hosts"  # empty: neither the jump host nor the target is known
    ssh = {"host": lab.ssh_host, "port": lab.ssh_port, "user": lab.ssh_user,
           "identity_file": lab.identity_file, "known_hosts": str(kh),
           "proxy_jump": f"{lab.ssh_user}@{lab.ssh_host}:{lab.ssh_port}"}
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  jumped:\n    transport: ssh\n    ssh: " + json.dumps(ssh)
                     + f"\n    root: {lab.state_dir}/jumped-root\n")
    inv = load_inventory(str(hosts))
    with open_transport(inv.get("jumped")) as t:
        with pytest.raises(HostKeyError) as e:
            t.run(["true"])
    msg = str(e.value)
    assert "jump host" in msg and not kh.exists()
    argv = _command(msg)
    assert argv == ["dfo", "hosts", "trust", "jumped"]
    # paste it (non-interactive: --yes) with this inventory
    assert main(["--hosts", str(hosts), *argv[1:], "--yes"]) == 0
    out = capsys.readouterr().out
    assert "jumped (jump host" in out and "trusted" in out
    with open_transport(load_inventory(str(hosts)).get("jumped")) as t:
        assert t.run(["echo", "ok"]).out == "ok\n"
