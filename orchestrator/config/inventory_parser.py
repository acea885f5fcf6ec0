"""The hosts.yaml parser: yaml's composed nodes, so every error names its line."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from dfo_contract.failure_classes import FAILURE_CLASSES

from ..common.errors import ConfigError
from ..transport.settings import SSHSettings
from .hostconfig import TRANSPORTS, GpuLayout, HostConfig, Inventory, did_you_mean
from .groups_parser import parse_groups
from .sshconfig import SSH_SPEC_RE, resolve_jumps, ssh_config_lookup
from .yaml_nodes import NodeReader

# Roots go into systemd-run's ExecStart and unit properties, where $ (environment), %
# (specifiers) and \ (escapes) are interpreted; keep those and control characters out.
_UNSAFE_ROOT = re.compile(r"[$%\\\x00-\x1f\x7f]")
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")

#: query parameters that carry a credential (``?token=...``, ``&api_key=...``)
_SECRET_QUERY = re.compile(r"(?:^|&)[^=&]*(?:token|key|passw|secret|auth|credential|sig)[^=&]*=",
                           re.IGNORECASE)
_HOST_KEYS = ("transport", "root", "ssh", "vmid", "profile", "gpus", "wheelhouse", "index_url",
              "python", "fallbacks", "cache")
_CACHE_KEYS = ("trusted_sources",)
_SSH_KEYS = ("host", "port", "user", "identity_file", "proxy_jump", "known_hosts", "connect_timeout")
_GPU_KEYS = ("target", "drafter")
_TOP_KEYS = ("default", "hosts", "groups")


class InventoryParser(NodeReader):
    def __init__(self, text: str, filename: str, ssh_config: str | None):
        super().__init__(text, filename)
        self.ssh_config_path = ssh_config
        self._ssh_config = None

    # -- the document ----------------------------------------------------------
    def parse(self, path: Path | None) -> Inventory:
        root = self.compose()
        if root is None:
            raise ConfigError(f"{self.filename}: the file is empty (add `hosts:`; see docs/hosts.md)")
        top = self.mapping(root, "", _TOP_KEYS)
        if "hosts" not in top:
            raise self.err(root, "hosts", "missing (add `hosts:` with at least one host; see docs/hosts.md)")
        hosts_key, hosts_node = top["hosts"]
        hmap = self.mapping(hosts_node, "hosts", None)
        if not hmap:
            raise self.err(hosts_node, "hosts", "expected at least one host")
        hosts: dict[str, HostConfig] = {}
        for name, (knode, vnode) in hmap.items():
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                raise self.err(knode, f"hosts.{name}", "a host name may hold only letters, digits, '.', '_' "
                                                       "and '-' and must start with a letter or digit")
            hosts[name] = self.host(name, knode, vnode)
        if "default" in top:
            dk, dv = top["default"]
            default = self.string(dv, "default")
            if default not in hosts:
                raise self.err(dv, "default", f"unknown host {default!r}{did_you_mean(default, hosts)}; "
                                              f"hosts: {', '.join(hosts)}")
        else:
            default = next(iter(hosts))
        groups = parse_groups(self, top["groups"][1], hosts) if "groups" in top else {}
        return Inventory(hosts=hosts, default=default, path=path, groups=groups)

    def host(self, name: str, knode: yaml.Node, node: yaml.Node) -> HostConfig:
        w = f"hosts.{name}"
        m = self.mapping(node, w, _HOST_KEYS)
        if "transport" not in m:
            raise self.err(node if isinstance(node, yaml.MappingNode) else knode, f"{w}.transport",
                           f"missing (one of: {', '.join(TRANSPORTS)})")
        tnode = m["transport"][1]
        transport = self.string(tnode, f"{w}.transport")
        if transport not in TRANSPORTS:
            raise self.err(tnode, f"{w}.transport", f"expected one of {', '.join(TRANSPORTS)}, "
                                                    f"got {transport!r}{did_you_mean(transport, TRANSPORTS)}")

        # ssh / vmid by transport
        ssh = None
        vmid = None
        if transport in ("ssh", "proxmox"):
            if "ssh" not in m:
                raise self.err(knode, f"{w}.ssh.host",
                               f"missing: a {transport} host needs the address to ssh to "
                               f"(add `ssh: {{host: NODE}}`)")
            ssh = self.ssh(m["ssh"][1], f"{w}.ssh", transport)
        elif "ssh" in m:
            raise self.err(m["ssh"][0], f"{w}.ssh", "a local host takes no ssh settings "
                                                    "(set `transport: ssh` or `proxmox`, or remove ssh:)")
        if transport == "proxmox":
            if "vmid" not in m:
                raise self.err(knode, f"{w}.vmid", "missing: a proxmox host needs the container's VMID (e.g. `vmid: 200`)")
            vmid = self.integer(m["vmid"][1], f"{w}.vmid", lo=100, hi=999_999_999)
        elif "vmid" in m:
            raise self.err(m["vmid"][0], f"{w}.vmid", f"only a proxmox host has a vmid (this one is {transport})")

        # root
        if "root" not in m:
            raise self.err(knode, f"{w}.root", "missing: the directory for envs, caches, runs and checkpoints"
                                               + (" (e.g. `root: ~/.dfo`)" if transport == "local" else " (e.g. `root: /root/dfo`)"))
        rnode = m["root"][1]
        root = self.string(rnode, f"{w}.root")
        if transport == "local":
            root = os.path.expanduser(root)
            if not os.path.isabs(root):
                raise self.err(rnode, f"{w}.root", f"must be an absolute path or start with ~, got {self.scalar(rnode)!r}")
            root = os.path.normpath(root)
        else:
            if not root.startswith("/"):
                raise self.err(rnode, f"{w}.root", f"must be an absolute path on the remote side, got {root!r} "
                                                   f"(e.g. /root/dfo; '~' is not expanded remotely)")
            root = os.path.normpath(root).replace("//", "/")
        if _UNSAFE_ROOT.search(root):
            raise self.err(rnode, f"{w}.root", f"must not contain $, %, \\ or control characters "
                                               f"(systemd would interpret them), got {root!r}")

        kw: dict[str, Any] = {}
        if "profile" in m:
            kw["profile"] = self.string(m["profile"][1], f"{w}.profile")
        if "gpus" in m:
            kw["gpus"] = self.gpus(m["gpus"][1], f"{w}.gpus")
        for key in ("wheelhouse", "python"):
            if key in m:
                v = self.string(m[key][1], f"{w}.{key}")
                if transport == "local":
                    v = os.path.expanduser(v)
                if key == "wheelhouse" and not v.startswith("/"):
                    raise self.err(m[key][1], f"{w}.{key}", f"must be an absolute path on the target, got {v!r}")
                kw[key] = v
        if "index_url" in m:
            v = self.string(m["index_url"][1], f"{w}.index_url")
            if not re.match(r"^(https?|file)://", v):
                raise self.err(m["index_url"][1], f"{w}.index_url", f"expected an http(s):// or file:// URL, got {v!r}")
            if re.match(r"^[a-z]+://[^/@]*@", v):
                raise self.err(m["index_url"][1], f"{w}.index_url",
                               "credentials in the URL would show in process lists and logs; "
                               "put them in ~/.netrc on the target (or uv's keyring) instead")
            if _SECRET_QUERY.search(v.partition("#")[0].partition("?")[2]):
                raise self.err(m["index_url"][1], f"{w}.index_url",
                               "a credential in the URL's query string would show in process "
                               "lists and logs; put it in ~/.netrc on the target, or in uv's "
                               "UV_INDEX_*_USERNAME/PASSWORD variables, instead")
            kw["index_url"] = v
        if "fallbacks" in m:
            kw["fallbacks"] = self.fallbacks(m["fallbacks"][1], f"{w}.fallbacks")
        if "cache" in m:
            kw["cache_trusted_sources"] = self.cache(m["cache"][1], f"{w}.cache")
        return HostConfig(name=name, transport=transport, root=root, ssh=ssh, vmid=vmid,
                          source=self.src(knode), **kw)

    def gpus(self, node: yaml.Node, where: str) -> GpuLayout:
        m = self.mapping(node, where, _GPU_KEYS)
        vals: dict[str, tuple[str, ...]] = {}
        for key in _GPU_KEYS:
            if key not in m:
                raise self.err(node, f"{where}.{key}", "missing (a list of devices, e.g. [cuda:0, cuda:1] or [cpu])")
            devs = self.string_list(m[key][1], f"{where}.{key}")
            if not devs:
                raise self.err(m[key][1], f"{where}.{key}", "expected at least one device")
            for i, d in enumerate(devs):
                if not _DEVICE_RE.match(d):
                    raise self.err(m[key][1], f"{where}.{key}[{i}]",
                                   f"expected a device like cuda:0 or cpu, got {d!r}")
            if len(set(devs)) != len(devs):
                raise self.err(m[key][1], f"{where}.{key}", f"lists a device twice: {list(devs)}")
            vals[key] = devs
        return GpuLayout(**vals)

    def cache(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        """``cache: {trusted_sources: [gpu1, ...]}``: hosts (inventory names or machine
        names) whose snapshots this host takes without --trust-other-hosts."""
        m = self.mapping(node, where, _CACHE_KEYS)
        if "trusted_sources" not in m:
            return ()
        vnode = m["trusted_sources"][1]
        names = self.string_list(vnode, f"{where}.trusted_sources")
        for i, n in enumerate(names):
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", n):
                raise self.err(vnode, f"{where}.trusted_sources[{i}]",
                               f"expected a host name (letters, digits, '.', '_', '-'), got {n!r}")
        return names

    def fallbacks(self, node: yaml.Node, where: str) -> dict[str, tuple[str, ...]]:
        from ..common.fallback import validate_ladders  # the supervisor's policy checks step names

        m = self.mapping(node, where, FAILURE_CLASSES)
        raw = {k: list(self.string_list(v, f"{where}.{k}")) for k, (_, v) in m.items()}
        for k, (_, v) in m.items():  # one class at a time, so an error names its line
            validate_ladders({k: raw[k]}, source=f"{self.src(v)}: {where}")
        return {k: tuple(steps) for k, steps in raw.items()}

    # -- ssh settings -----------------------------------------------------------
    def ssh(self, node: yaml.Node, where: str, transport: str) -> SSHSettings:
        given: dict[str, Any] = {}
        nodes: dict[str, yaml.Node] = {}
        if isinstance(node, yaml.ScalarNode) and isinstance(self.scalar(node), str):
            spec = self.string(node, where)
            mt = SSH_SPEC_RE.match(spec)
            if not mt:
                raise self.err(node, where, f"expected [user@]host[:port] or a mapping, got {spec!r}")
            given["host"] = mt["host"].strip("[]")
            if mt["user"]:
                given["user"] = mt["user"]
            if mt["port"]:
                given["port"] = int(mt["port"])
            nodes = {k: node for k in given}
        else:
            if isinstance(node, yaml.ScalarNode) and self.scalar(node) is None:
                raise self.err(node, f"{where}.host", f"missing: a {transport} host needs the address to ssh to")
            m = self.mapping(node, where, _SSH_KEYS)
            for key, (_, v) in m.items():
                nodes[key] = v
                if key == "port":
                    given[key] = self.integer(v, f"{where}.port", lo=1, hi=65535)
                elif key == "connect_timeout":
                    given[key] = self.number(v, f"{where}.connect_timeout")
                else:
                    given[key] = self.string(v, f"{where}.{key}")
            if "host" not in given:
                raise self.err(node, f"{where}.host", f"missing: a {transport} host needs the address to ssh to "
                                                      f"(e.g. `host: 192.0.2.10` or an alias from ~/.ssh/config)")

        alias = given["host"]
        cfg = self.ssh_config_for(alias)
        host = cfg.get("hostname") or alias
        port = given.get("port")
        if port is None and cfg.get("port"):
            try:
                port = int(cfg["port"])
            except ValueError:
                raise self.err(nodes["host"], f"{where}.host",
                               f"~/.ssh/config gives Port {cfg['port']!r} for {alias}, not a number") from None
        user = given.get("user") or cfg.get("user")
        identity = given.get("identity_file")
        if identity is not None:
            expanded = os.path.expanduser(identity)
            if not os.path.isfile(expanded):
                raise self.err(nodes["identity_file"], f"{where}.identity_file",
                               f"{identity} does not exist (fix the path, or remove it to use ~/.ssh/config "
                               f"and the ssh agent)")
            identity = expanded
        else:
            for cand in cfg.get("identityfile", []) or []:
                cand = os.path.expanduser(cand)
                if os.path.isfile(cand):
                    identity = cand
                    break
        proxy_jump = given.get("proxy_jump") or cfg.get("proxyjump")
        if proxy_jump and proxy_jump.lower() == "none":
            proxy_jump = None
        if proxy_jump:
            for hop in proxy_jump.split(","):
                if not SSH_SPEC_RE.match(hop.strip()):
                    raise self.err(nodes.get("proxy_jump", node), f"{where}.proxy_jump",
                                   f"expected [user@]host[:port][,...], got {proxy_jump!r}")
        known = given.get("known_hosts")
        if known is None and cfg.get("userknownhostsfile"):
            known = cfg["userknownhostsfile"].split()[0]
        if known is not None:
            known = os.path.expanduser(known)
        timeout = given.get("connect_timeout")
        if timeout is None and cfg.get("connecttimeout"):
            try:
                timeout = float(cfg["connecttimeout"])
            except ValueError:
                timeout = None
        target = SSHSettings(host=host, port=port or 22, user=user, identity_file=identity,
                             proxy_jump=proxy_jump, known_hosts=known,
                             connect_timeout=timeout if timeout is not None else 10.0)
        return resolve_jumps(target, self.ssh_config_path)

    def ssh_config_for(self, alias: str) -> dict[str, Any]:
        return ssh_config_lookup(alias, self.ssh_config_path)
