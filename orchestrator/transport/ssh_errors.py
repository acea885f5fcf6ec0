"""paramiko/socket exceptions from connecting, as one-line ``ConnectError``/``HostKeyError``s
with the fix; and the host-key policy that refuses unknown keys (never auto-add)."""

from __future__ import annotations

import errno
import os
import socket

import paramiko

from ..common.errors import ConnectError, HostKeyError
from . import knownhosts
from .settings import SSHSettings


def _label(s: SSHSettings) -> str:
    return f"{s.user + '@' if s.user else ''}{s.host}:{s.port}"


class RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse an unknown host key, naming its fingerprint and the command that trusts it."""

    def __init__(self, name: str, known_hosts: str, trust_as: str | None = None):
        self.name = name  # what is connected to, e.g. "pve (jump host 192.0.2.1)"
        self.known_hosts = known_hosts
        self.trust_as = trust_as or name  # the inventory host whose `dfo hosts trust` covers it

    def missing_host_key(self, client, hostname, key):
        raise HostKeyError(
            f"host key of {self.name} ({hostname}) is not known: {knownhosts.describe_key(key)}",
            hint=f"check that fingerprint, then record it in {self.known_hosts} with "
                 f"`{trust_command(self.trust_as)}`"
                 + (" (it asks for the jump hosts first)" if self.trust_as != self.name else ""))


def trust_command(host: str, *extra: str) -> str:
    """The `dfo hosts trust` command line for an inventory host (jump hosts included)."""
    return " ".join(["dfo", "hosts", "trust", host, *extra])


def translate(e: BaseException, name: str, s: SSHSettings, trust_as: str | None = None) -> BaseException:
    """A paramiko/socket exception from connecting as a one-line ConnectError with the fix
    (``trust_as``: the inventory host to name in `dfo hosts trust`, when ``name`` is a hop)."""
    where = _label(s)
    if isinstance(e, (HostKeyError, ConnectError)):
        return e
    if isinstance(e, paramiko.BadHostKeyException):
        return HostKeyError(
            f"REMOTE HOST KEY CHANGED for {name} ({where}): it offers {knownhosts.describe_key(e.key)} "
            f"but {s.known_hosts_path} has {knownhosts.describe_key(e.expected_key)}; "
            f"someone may be intercepting the connection",
            hint=f"if the host was reinstalled, verify the new key and run "
                 f"`{trust_command(trust_as or name, '--replace')}`")
    if isinstance(e, paramiko.PasswordRequiredException):
        return ConnectError(f"cannot log in to {name} ({where}): the private key is encrypted",
                            hint="add it to ssh-agent (ssh-add) or set ssh.identity_file to an unencrypted key")
    if isinstance(e, paramiko.AuthenticationException):
        return ConnectError(f"authentication failed for {name} ({where})",
                            hint="check ssh.user and ssh.identity_file in hosts.yaml or ~/.ssh/config, "
                                 "and that the public key is in the host's authorized_keys")
    if isinstance(e, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        return ConnectError(f"cannot reach {name} ({where}): connection refused",
                            hint="check ssh.host and ssh.port, and that sshd runs there")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return ConnectError(f"cannot reach {name} ({where}): timed out after {s.connect_timeout:g}s",
                            hint="check ssh.host/ssh.port and the network; raise ssh.connect_timeout "
                                 "for slow links")
    if isinstance(e, socket.gaierror):
        return ConnectError(f"cannot reach {name}: cannot resolve host {s.host!r}",
                            hint="fix ssh.host in hosts.yaml or HostName in ~/.ssh/config")
    if isinstance(e, paramiko.ChannelException):
        return ConnectError(f"cannot reach {name} ({where}) through the jump host: {e}",
                            hint="check ssh.host/ssh.port as seen from the jump host")
    if isinstance(e, OSError):
        reason = os.strerror(e.errno) if e.errno else str(e)
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.ECONNRESET):
            return ConnectError(f"cannot reach {name} ({where}): {reason}",
                                hint="check ssh.host and ssh.port, and that sshd runs there")
        return ConnectError(f"cannot reach {name} ({where}): {reason or type(e).__name__}",
                            hint="check ssh.host and ssh.port")
    if isinstance(e, (paramiko.SSHException, EOFError)):
        return ConnectError(f"SSH to {name} ({where}) failed: {e or type(e).__name__}",
                            hint="check that ssh.host/ssh.port is an SSH server and reachable")
    return e  # not ours to translate
