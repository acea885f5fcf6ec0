"""hosts.yaml: the inventory of hosts, loaded and validated into ``HostConfig``s.

Search order (``load_inventory``): an explicit path, ``$DFO_HOSTS``, ``./hosts.yaml``,
``~/.config/dfo/hosts.yaml``, then the embedded default (one ``local`` host).

Every validation error is a ``ConfigError`` of one line naming the file and line:
``hosts.yaml:12: hosts.pve.vmid: expected an integer, got 'two hundred'``. Line
numbers come from yaml's composed nodes (``yaml.compose``), so duplicate keys,
unknown keys and wrong types are all reported where they are written.

SSH settings not given in hosts.yaml come from ``~/.ssh/config`` (paramiko's
``SSHConfig``, read once in ``config.sshconfig``): HostName, Port, User, IdentityFile,
ProxyJump, UserKnownHostsFile, ConnectTimeout.
"""

from __future__ import annotations

import os
from pathlib import Path

from dfo_contract.failure_classes import FAILURE_CLASSES

from ..common.errors import ConfigError
from ..transport.settings import SSHSettings
from .hostconfig import TRANSPORTS, GpuLayout, HostConfig, Inventory
from .inventory_parser import InventoryParser
from .sshconfig import parse_ssh_spec, resolve_jumps, ssh_config_lookup

__all__ = ["SSHSettings", "FAILURE_CLASSES", "TRANSPORTS", "GpuLayout", "HostConfig", "Inventory",
           "EMBEDDED_DEFAULT", "find_inventory_file", "load_inventory", "parse_inventory",
           "parse_ssh_spec", "resolve_jumps", "ssh_config_lookup"]

# --------------------------------------------------------------------------- loading

EMBEDDED_DEFAULT = """\
default: local
hosts:
  local:
    transport: local
    root: ~/.dfo
    profile: cpu-pypi
    gpus: {target: [cpu], drafter: [cpu]}
"""


def find_inventory_file(path: str | None) -> Path | None:
    """The hosts.yaml to use, by the search order; None means the embedded default."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"hosts file {path} does not exist (fix the --hosts path or $DFO_HOSTS)")
        return p
    env = os.environ.get("DFO_HOSTS")
    if env:
        p = Path(env)
        if not p.is_file():
            raise ConfigError(f"hosts file {env} (from $DFO_HOSTS) does not exist (fix or unset DFO_HOSTS)")
        return p
    for p in (Path("hosts.yaml"), Path("~/.config/dfo/hosts.yaml").expanduser()):
        if p.is_file():
            return p
    return None


def load_inventory(path: str | None = None, *, ssh_config: str | None = None) -> Inventory:
    """Load and validate the inventory (see the module docstring for the search order).

    ``ssh_config`` overrides the ssh config file read for unset SSH settings
    (default ``~/.ssh/config``; tests point it elsewhere)."""
    p = find_inventory_file(path)
    if p is None:
        return parse_inventory(EMBEDDED_DEFAULT, "<embedded default>", path=None,
                               ssh_config=ssh_config)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None
    return parse_inventory(text, str(p), path=p, ssh_config=ssh_config)


def parse_inventory(text: str, filename: str, *, path: Path | None = None,
                    ssh_config: str | None = None) -> Inventory:
    """Validate hosts.yaml text; ``filename`` is used in messages."""
    return InventoryParser(text, filename, ssh_config).parse(path)
