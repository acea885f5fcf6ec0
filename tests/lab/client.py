"""Drive the lab the way a person on a Proxmox node would: the OpenSSH client."""

from __future__ import annotations

import shlex
import subprocess


def ssh(info, argv: list[str], *, input_: bytes | None = None, timeout: float = 60):
    """Run argv on the lab node through the real OpenSSH client (quoted once,
    with shlex, for the node's shell). Returns a CompletedProcess with bytes."""
    return subprocess.run(info.ssh_argv(shlex.join(argv)), input=input_ or b"",
                          capture_output=True, timeout=timeout)


def ct(info, *argv: str, **kw):
    """Run argv in the lab container: ssh node -> pct exec VMID -- argv."""
    return ssh(info, ["pct", "exec", str(info.vmid), "--", *argv], **kw)
