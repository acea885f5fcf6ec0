"""``dfo hosts trust``: fetch each hop's host key and record it in known_hosts when the
user says so (jump hosts first)."""

from __future__ import annotations

from typing import Callable

import paramiko

from . import knownhosts
from .settings import SSHSettings
from .ssh import connect_client, jump_hops, open_sock
from .ssh_errors import translate


def fetch_host_key(s: SSHSettings, name: str, via: paramiko.SSHClient | None = None, *,
                   trust_as: str | None = None) -> paramiko.PKey:
    """The host key ``s`` offers (no authentication). Prefers a key type known_hosts
    already has for it, so a changed key is detected the way connecting would see it."""
    t = None
    try:
        sock = open_sock(s, via)
        t = paramiko.Transport(sock)
        known = knownhosts.lookup(s.known_hosts_path, s.host_key_name)
        if known:
            opts = t.get_security_options()
            kt = known[0].get_name()
            if kt == "ssh-rsa":
                kt = "rsa-sha2-512"
            if kt in opts.key_types:
                opts.key_types = [kt] + [k for k in opts.key_types if k != kt]
        t.banner_timeout = s.connect_timeout
        t.start_client(timeout=s.connect_timeout)
        return t.get_remote_server_key()
    except Exception as e:  # noqa: BLE001
        raise translate(e, name, s, trust_as) from None
    finally:
        if t is not None:
            t.close()


TrustDecision = Callable[[str, str, paramiko.PKey, str], bool]


def trust_hosts(name: str, settings: SSHSettings, decide: TrustDecision) -> list[tuple[str, str, str]]:
    """Walk the hops to ``settings`` (jump hosts first), fetch each host key and, when it is
    not known, ask ``decide(label, known_hosts_name, key, status)`` whether to record it
    (status is knownhosts.UNKNOWN or CHANGED; CHANGED entries are replaced).
    Returns [(label, fingerprint, outcome)] with outcome "known", "added", "replaced" or "skipped"."""
    report = []
    via = None
    clients: list[paramiko.SSHClient] = []
    try:
        hops = jump_hops(settings)
        for i, s in enumerate([*hops, settings]):
            is_target = i == len(hops)
            label = name if is_target else f"{name} (jump host {s.host})"
            key = fetch_host_key(s, label, via, trust_as=name)
            kh_name = s.host_key_name
            st = knownhosts.status(s.known_hosts_path, kh_name, key)
            fp = knownhosts.describe_key(key)
            if st == knownhosts.KNOWN:
                report.append((label, fp, "known"))
            elif decide(label, kh_name, key, st):
                knownhosts.add(s.known_hosts_path, kh_name, key, replace=st == knownhosts.CHANGED)
                report.append((label, fp, "replaced" if st == knownhosts.CHANGED else "added"))
            else:
                report.append((label, fp, "skipped"))
                break
            if not is_target:
                via = connect_client(s, label, via, trust_as=name)
                clients.append(via)
    finally:
        for c in reversed(clients):
            c.close()
    return report
