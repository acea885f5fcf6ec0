"""The ``proxmox`` transport: SSH to the Proxmox node, then ``pct exec VMID`` into the container.

- Commands: ``pct exec VMID --keep-env 0 -- env [-C DIR] -- PATH=... HOME=/root LANG=C.UTF-8
  K=V ... ARGV``, shlex-joined once for the node's login shell. ``pct`` execs lxc-attach,
  so no shell sits between pct and the command. ``--keep-env 0``: the node's environment
  (its PATH, SSH_CONNECTION, locale) must not leak into the container; dfo passes what a
  command needs explicitly (``orchestrator.transport.command.CONTAINER_ENV`` plus ``env``).
- Files: piped through the SSH channel into the container's stdin (``pct exec ... sh -c
  'cat > tmp && mv'``): nothing is written on the node, and no host file is ever
  redirected into pct exec (lxc-attach changes the owner and mode of its stdio files).
- The container's state: ``pct status VMID`` -> ``status: running``. It is checked once,
  before the first command, and again after a command or a stream that failed; a stopped
  container is a ContainerError with the command that starts it, a missing ``pct`` a
  ConnectError ("is this a Proxmox node?").
"""

from __future__ import annotations

import logging
import re
from typing import Mapping, Sequence

from ..common.errors import ConnectError, ContainerError
from . import command as cmd
from .base import Result
from .settings import SSHSettings
from .ssh import SSHTransport

log = logging.getLogger("dfo")

#: stderr of pct exec / lxc-attach when the container is gone (confirmed by pct status)
_STOPPED_HINTS = ("not running", "Failed to get init pid", "lxc-attach:")
_PCT_STATUS_RE = re.compile(r"^status:\s*(\S+)\s*$", re.M)


def parse_pct_status(out: Result) -> str | None:
    """``status: running`` -> "running"; None when pct did not say (see stderr)."""
    if out.exit_code != 0:
        return None
    m = _PCT_STATUS_RE.search(out.stdout.decode("utf-8", "replace"))
    return m.group(1) if m else None


class ProxmoxTransport(SSHTransport):
    kind = "proxmox"

    def __init__(self, name: str, settings: SSHSettings, vmid: int):
        super().__init__(name, settings)
        self.vmid = int(vmid)
        self._checked = False

    # --- the node -------------------------------------------------------
    def run_node(self, argv: Sequence[str], *, timeout: float | None = None,
                 stdin: bytes | None = None, check: bool = False) -> Result:
        """Run argv on the Proxmox node itself (not in the container)."""
        argv = cmd.check_argv(argv)
        return self._exec(argv, cmd.ssh_command(cmd.with_timeout(argv, timeout)), stdin=stdin,
                          timeout=timeout, check=check)

    def node_label(self) -> str:
        return self.settings.host

    def container_status(self) -> str:
        """``running``, ``stopped`` (or another state pct reports).
        Raises ContainerError when the container does not exist, ConnectError when the
        node has no ``pct``."""
        res = self.run_node(cmd.pct_status(self.vmid), timeout=60)
        status = parse_pct_status(res)
        if status is not None:
            return status
        text = (res.err.strip() or res.out.strip()).splitlines()
        last = text[-1].strip() if text else f"exit {res.exit_code}"
        if res.exit_code == 127 or "command not found" in res.err or "pct: not found" in res.err:
            raise ConnectError(f"`pct` is missing on {self.name}'s host {self.node_label()}: "
                               f"is this a Proxmox node?",
                               hint="use `transport: ssh` for a plain SSH host, or fix ssh.host")
        if "does not exist" in res.err or "no such" in res.err.lower():
            raise ContainerError(f"container {self.vmid} does not exist on {self.name} "
                                 f"({self.node_label()}): {last}",
                                 hint=f"fix vmid in hosts.yaml (list them: ssh {self.node_label()} pct list)")
        raise ContainerError(f"cannot get the state of container {self.vmid} on {self.name}: {last}")

    def container_running(self) -> bool:
        return self.container_status() == "running"

    def ensure_running(self) -> None:
        """Once per connection: the container must be running before we exec into it."""
        if self._checked:
            return
        self._require_running()

    def _require_running(self) -> None:
        status = self.container_status()
        if status != "running":
            raise ContainerError(
                f"container {self.vmid} on {self.name} is {status}",
                hint=f"start it: ssh {self.node_label()} pct start {self.vmid}")
        self._checked = True

    # --- commands in the container ----------------------------------------
    def render(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
        return cmd.shell_join(cmd.pct_exec(self.vmid, argv, env, cwd))

    def run(self, argv, *, env=None, cwd=None, timeout=None, stdin=None, check=False) -> Result:
        self.ensure_running()
        res = super().run(argv, env=env, cwd=cwd, timeout=timeout, stdin=stdin, check=False)
        self._after(res)
        return res.check() if check else res

    def stream(self, argv, on_line, *, env=None, cwd=None, timeout=None) -> Result:
        """A stream that ends with an error may have ended because the container stopped
        (lxc-attach's own error goes to ``on_line`` with the command's stderr): that is
        checked with ``pct status`` and said as ContainerError, like every command's."""
        self.ensure_running()
        res = super().stream(argv, on_line, env=env, cwd=cwd, timeout=timeout)
        if res.exit_code != 0:
            self._checked = False
            self._require_running()
        return res

    def _after(self, res: Result) -> None:
        """pct exec failing because the container stopped meanwhile: say so plainly.
        (Confirmed with ``pct status``, so a command that prints "not running" itself is
        never mistaken for a stopped container.)"""
        if res.exit_code != 0 and "Unknown option: keep-env" in res.err:
            raise ConnectError(f"pct on {self.name}'s host {self.node_label()} does not know --keep-env",
                               hint="upgrade pve-container on the node (dfo needs `pct exec --keep-env 0`)")
        if res.exit_code != 0 and any(s in res.err for s in _STOPPED_HINTS):
            self._checked = False
            self._require_running()
