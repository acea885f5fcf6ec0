"""~/.ssh/config and ``[user@]host[:port]`` specs, read once here: the inventory resolves
every SSH setting (ProxyJump hops included) before a transport sees it."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from ..common.errors import ConfigError
from ..transport.settings import SSHSettings

SSH_SPEC_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def ssh_config_lookup(alias: str, path: str | None = None) -> dict[str, Any]:
    """What ~/.ssh/config (or ``path``) says about ``alias``; {} when there is no config."""
    import paramiko

    p = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.isfile(p):
        return {}
    try:
        cfg = paramiko.SSHConfig.from_path(p)
        found = dict(cfg.lookup(alias))
    except Exception as e:  # noqa: BLE001 - paramiko raises assorted errors for bad configs
        raise ConfigError(f"{p}: cannot parse ssh config: {e} (fix that file)") from None
    # paramiko fills hostname with the alias itself when nothing matches
    return found


def parse_ssh_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` -> (user, host, port)."""
    mt = SSH_SPEC_RE.match(spec.strip())
    if not mt:
        raise ConfigError(f"bad ssh destination {spec!r} (expected [user@]host[:port])")
    return mt["user"], mt["host"].strip("[]"), int(mt["port"]) if mt["port"] else None


def resolve_jumps(settings: SSHSettings, ssh_config: str | None = None) -> SSHSettings:
    """``settings`` with its ProxyJump chain resolved into ``jumps`` (each hop's unset
    settings from ~/.ssh/config; user, identity, known_hosts and timeout default to the
    target's)."""
    hops = []
    for spec in (settings.proxy_jump or "").split(","):
        spec = spec.strip()
        if not spec:
            continue
        user, alias, port = parse_ssh_spec(spec)
        cfg = ssh_config_lookup(alias, ssh_config)
        identity = None
        for cand in cfg.get("identityfile", []) or []:
            cand = os.path.expanduser(cand)
            if os.path.isfile(cand):
                identity = cand
                break
        hops.append(SSHSettings(
            host=cfg.get("hostname") or alias,
            port=port or int(cfg.get("port") or 22),
            user=user or cfg.get("user") or settings.user,
            identity_file=identity or settings.identity_file,
            known_hosts=settings.known_hosts,
            connect_timeout=settings.connect_timeout,
        ))
    return dataclasses.replace(settings, jumps=tuple(hops))
