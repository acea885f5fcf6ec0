"""``--group NAME`` for ``dfo deploy``, ``dfo warm-cache`` and ``dfo hosts check``: the same
per-host work as with ``--host``, on every member in parallel (``for_each_host``: one
transport, i.e. one connection, each). One member failing never hides the others' results.

``progress(host, text)`` is called from the members' threads with what each is doing now.
``transport_for(host)`` opens (or reuses) the host's transport; it must be thread-safe.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.replies import PortRecord

from ..config.hostconfig import GroupConfig, HostConfig
from ..common.errors import DfoError, NotFoundError, RemoteCommandError
from ..plan import group_check as gc
from ..plan.deploy_plan import FINGERPRINT_FILE
from ..plan.fingerprint import parse_fingerprint
from ..plan.probes import HostCheck
from ..transport import Transport
from .group import HostOutcome, for_each_host, worst_exit

log = logging.getLogger("dfo")

Progress = Callable[[str, str], None]
TransportFor = Callable[[HostConfig], Transport]

EXIT_ENV_DIFFERS = 7     # DeployError: run dfo deploy --group
EXIT_UNREACHABLE = 3     # ConnectError: the head cannot be reached


def _quiet(host: str, text: str) -> None:
    pass


# ------------------------------------------------------------------ deploy --group

def deploy_group(hosts: Sequence[HostConfig], transport_for: TransportFor, *, action: str = "deploy",
                 profile: str | None = None, force: bool = False, progress: Progress = _quiet,
                 wheel=None, find_links: tuple[str, ...] = ()) -> list[HostOutcome]:
    """``dfo deploy`` (``action`` deploy, check or rollback) on every member; dfo's wheel is
    built once, before the members start. ``check`` finding drift is that member's failure
    (exit 7), with its report kept."""
    from ..common.errors import DriftError
    from .deploy import Deployer
    from .wheel import build as build_wheel

    if wheel is None and action != "rollback":
        for h in hosts:
            progress(h.name, "building dfo's wheel (once, for every member)")
        wheel = build_wheel()

    def one(h: HostConfig):
        def on_event(stage: str, status: str, seconds, detail: str) -> None:
            if status in ("start", "line", "done"):
                progress(h.name, f"{stage}: {detail}" if detail else stage)

        d = Deployer(transport_for(h), h, profile=profile, on_event=on_event, wheel=wheel,
                     find_links=find_links)
        if action == "check":
            return d.check()
        if action == "rollback":
            return d.rollback()
        return d.deploy(force=force)

    outs = for_each_host(hosts, one)
    for o in outs:
        r = o.value
        if action == "check" and r is not None and not r.ok:
            first = r.drift[0] if r.drift else ""
            e = DriftError(f"envs/current differs from its lock ({len(r.drift)} "
                           f"difference(s), first: {first})", hint="run `dfo deploy` to repair it")
            o.error, o.exit_code = str(e), e.exit_code
    return outs


# ------------------------------------------------------------------ warm-cache --group

def warm_cache_group(hosts: Sequence[HostConfig], transport_for: TransportFor, req, *,
                     timeout: float | None = None, progress: Progress = _quiet) -> list[HostOutcome]:
    """``dfo warm-cache`` (restore this env's snapshot, else warm up) on every member."""
    from .cache_command import warm_cache
    from dfo_contract.trainer_markers import PhaseMarker

    from .compile_cache import CacheManager

    req.validate()

    def one(h: HostConfig):
        def events(kind: str, data) -> None:
            if kind == "stage":
                progress(h.name, f"{data.get('stage', '?')}: {data.get('what', '')}")
            elif isinstance(data, PhaseMarker):
                progress(h.name, f"warmup [{data.phase}]")

        mgr = CacheManager(transport_for(h), h.tree, host=h.name, events=events, timeout=timeout,
                           trusted_sources=h.cache_trusted_sources)
        return warm_cache(mgr, req, stage=lambda name, what: progress(h.name, f"{name}: {what}"))

    return for_each_host(hosts, one)


# ------------------------------------------------------------------ hosts check --group

@dataclass
class MemberFacts:
    """One member as ``dfo hosts check --group`` found it."""

    check: HostCheck
    fingerprint: EnvFingerprint | None = None   # envs/current/fingerprint.json (None: no env)
    python: str | None = None                   # the interpreter the port probe runs with


@dataclass
class GroupCheck:
    group: GroupConfig
    members: list[HostOutcome] = field(default_factory=list)   # HostOutcome[MemberFacts]
    env: list[gc.Difference] = field(default_factory=list)
    reach: list[gc.Reach] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        code = worst_exit(self.members)
        if code:
            return code
        if any(not r.ok for r in self.reach):
            return EXIT_UNREACHABLE
        return EXIT_ENV_DIFFERS if self.env else 0

    @property
    def problems(self) -> list[str]:
        return ([f"{o.host}: {o.error}" for o in self.members if not o.ok]
                + [r.message for r in self.reach if not r.ok] + [str(d) for d in self.env])

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group.name, "head": self.group.head, "head_addr": self.group.head_addr,
                "ports": [self.group.port, self.group.coord_port],
                "ok": self.exit_code == 0, "exit_code": self.exit_code,
                "hosts": [{"host": o.host, "ok": o.ok, "error": o.error, "exit_code": o.exit_code,
                           "check": o.value.check.to_json() if o.value else None,
                           "fingerprint": (o.value.fingerprint.to_json()
                                           if o.value and o.value.fingerprint else None)}
                          for o in self.members],
                "env_differences": [d.to_json() for d in self.env],
                "reach": [r.to_json() for r in self.reach],
                "problems": self.problems}


def read_fingerprint(t: Transport, host: HostConfig) -> EnvFingerprint | None:
    """``envs/current/fingerprint.json`` of ``host`` (None: no env deployed there, or none
    that reads)."""
    path = posixpath.join(host.tree.current_env, FINGERPRINT_FILE)
    try:
        return parse_fingerprint(t.get(path))
    except (NotFoundError, RemoteCommandError, ValueError):
        return None


def check_group(group: GroupConfig, hosts: Sequence[HostConfig], transport_for: TransportFor, *,
                progress: Progress = _quiet, listen_s: float = gc.LISTEN_S) -> GroupCheck:
    """Every member checked as ``dfo hosts check`` does, then: their envs agree, their
    profiles agree, and every member reaches the head on ``head_addr`` at both ports."""
    from .hostcheck import check_host

    def one(h: HostConfig) -> MemberFacts:
        progress(h.name, "checking the host")
        t = transport_for(h)
        c = check_host(h, t)
        facts = MemberFacts(check=c)
        if c.exit_code:
            return facts
        progress(h.name, "reading envs/current/fingerprint.json")
        facts.fingerprint = read_fingerprint(t, h)
        facts.python = h.python or (c.python.executable if c.python else None)
        progress(h.name, "checked")
        return facts

    res = GroupCheck(group=group, members=for_each_host(hosts, one))
    for o in res.members:
        if o.ok and o.value is not None and o.value.check.exit_code:
            o.error = o.value.check.error or (o.value.check.problems or ["check failed"])[0]
            o.exit_code = o.value.check.exit_code
    facts = {o.host: o.value for o in res.members if o.ok and o.value is not None}
    names = [h.name for h in hosts]
    res.env = gc.env_differences(group.name, names, {h: f.fingerprint for h, f in facts.items()})
    res.env += gc.profile_differences(
        group.name, names, {h.name: h.profile for h in hosts},
        {h: f.fingerprint.profile if f.fingerprint else None for h, f in facts.items()})
    head = hosts[0]
    if head.name in facts and facts[head.name].python:
        peers = [h for h in hosts[1:] if h.name in facts and facts[h.name].python]
        res.reach = probe_reach(group, head, transport_for, facts, peers, progress=progress,
                                listen_s=listen_s)
    elif head.name in facts:
        res.reach = [gc.Reach(head.name, False, f"no python3 on {head.name} to listen with "
                                                f"(set python: in hosts.yaml)", "head")]
    return res


def probe_reach(group: GroupConfig, head: HostConfig, transport_for: TransportFor,
                facts: dict[str, MemberFacts], peers: Sequence[HostConfig], *,
                progress: Progress = _quiet, listen_s: float = gc.LISTEN_S) -> list[gc.Reach]:
    """A short-lived listener on the head at head_addr on ``port`` and ``coord_port``; every
    peer connects to it. The listener ends when every peer reached every port, when the head
    sends it ``stop`` once all have tried, or after ``listen_s``."""
    ports = [group.port, group.coord_port]
    addr = group.head_addr
    python = {name: f.python for name, f in facts.items() if f.python}  # head and peers have one
    lines: list[str] = []
    ready = threading.Event()
    failure: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if '"listening"' in line:
            ready.set()

    def listener() -> None:
        try:
            argv = gc.listen_argv(python[head.name], addr, ports, len(peers), listen_s)
            r = transport_for(head).stream(argv, on_line, timeout=listen_s + 60)
            if r.exit_code != 0 and not ready.is_set():
                failure.append(f"the listener exited {r.exit_code}: "
                               + (lines[-1] if lines else "no output"))
        except DfoError as e:
            failure.append(str(e))
        finally:
            ready.set()

    progress(head.name, f"listening on {addr}:{ports[0]},{ports[1]}")
    th = threading.Thread(target=listener, name="dfo-listen", daemon=True)
    th.start()
    ready.wait(listen_s + 60)
    records = gc.parse_port_lines(list(lines))
    if failure or not any(r.event == "listening" for r in records):
        th.join(5)
        return gc.judge_reach(head.name, addr, ports, None,
                              failure[0] if failure else "the listener did not start", {})
    bound = [r.port for r in records if r.event == "bind" and r.ok and r.port is not None]

    def connect(h: HostConfig) -> list[PortRecord]:
        progress(h.name, f"connecting to {addr}:{ports[0]},{ports[1]}")
        r = transport_for(h).run(gc.connect_argv(python[h.name], addr, bound or ports, h.name),
                                 timeout=gc.CONNECT_TIMEOUT_S * len(ports) + 60)
        recs = gc.parse_port_lines(r.out.splitlines())
        if not recs:
            raise RemoteCommandError(f"the probe exited {r.exit_code}: "
                                     f"{(r.err.strip().splitlines() or ['no output'])[-1]}")
        return recs

    outs = for_each_host(peers, connect) if bound else []
    members: dict[str, Any] = {o.host: (o.value if o.ok else o.error) for o in outs}
    if th.is_alive():  # some peer did not get through: the head itself ends its listener
        try:  # (a second channel on the head's connection: ssh.Connection is thread-safe)
            transport_for(head).run(gc.connect_argv(python[head.name], addr, bound[:1],
                                                    "stop"), timeout=60)
        except DfoError as e:
            log.debug("stopping the listener on %s: %s", head.name, e)
    th.join(listen_s + 60)
    records = gc.parse_port_lines(list(lines))
    return gc.judge_reach(head.name, addr, ports, records, None, members)
