"""Find the sshd processes serving one TCP connection (by the client's port), so a test can
kill "the sshd child serving it" without touching other sessions of the shared lab sshd."""

from __future__ import annotations

import os


def _inodes(local_port_server: int, client_port: int) -> set[str]:
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            lport = int(f[1].rsplit(":", 1)[1], 16)
            rport = int(f[2].rsplit(":", 1)[1], 16)
            if lport == local_port_server and rport == client_port:
                out.add(f[9])
    return out


def sshd_pids_serving(sshd_port: int, client_port: int) -> list[int]:
    inodes = _inodes(sshd_port, client_port)
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    tgt = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if tgt.startswith("socket:[") and tgt[8:-1] in inodes:
                    pids.append(int(p))
                    break
        except OSError:
            continue
    return sorted(pids)


def client_port(ssh_transport) -> int:
    """The local port of an SSHTransport's live connection."""
    t = ssh_transport.conn.transport()
    return t.sock.getsockname()[1]
