"""Do a group's members agree, and can they reach the head? Pure: no I/O.

``dfo hosts check --group`` and ``dfo launch --group`` use the same judges:

- ``env_differences(group, hosts, fingerprints)``: each member's deployed env
  (``envs/current/fingerprint.json``) against the head's, one ``Difference`` per member
  that differs, naming the host, what differs, and the fix (``run dfo deploy --group G``);
- ``profile_differences(group, hosts, configured, deployed)``: the profile hosts.yaml gives
  each member against the head's, and against the profile its deployed env was built from;
- the head-reachability probe (``orchestrator/remote/port_probe.py``): its argvs and a judge
  of what it printed (``judge_reach``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from dfo_contract.errors import ContractError
from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.fsio import json_object
from dfo_contract.replies import PortRecord

from .scripts import remote_source

#: fingerprint fields that must agree across a group's members (in the order a person reads
#: them; device names/counts may differ between nodes, so they are not compared)
ENV_FIELDS: tuple[tuple[str, str], ...] = (
    ("profile", "profile"), ("python", "python"), ("torch", "torch"),
    ("torch_cuda", "torch CUDA"), ("torch_git", "torch git"), ("triton", "triton"),
    ("transformers", "transformers"), ("dfo", "dfo"), ("lock_hash", "lock"))

PORT_MARK = "@dfo-port "
#: seconds the head's listener waits for the members' connections
LISTEN_S = 30.0
#: seconds each member's connection attempt may take
CONNECT_TIMEOUT_S = 5.0
NO_ENV = "no env deployed"


@dataclass(frozen=True)
class Difference:
    """One member that differs from the head: ``str()`` is the one line a person reads."""

    host: str          # the member that differs
    head: str          # the member it is compared with (node 0)
    what: str          # ``torch 2.11.0+cu128 vs 2.11.0+cu130``, ``no env deployed``, ...
    fix: str           # ``run dfo deploy --group pair``

    def __str__(self) -> str:
        if self.what == NO_ENV:
            where = "the head " if self.host == self.head else ""
            return f"no env deployed on {where}{self.host}: {self.fix}"
        if self.what.startswith("hosts.yaml") or self.what.startswith("its env is"):
            return f"{self.host}: {self.what}: {self.fix}"
        return f"{self.host}'s env differs from {self.head}'s ({self.what}): {self.fix}"

    def to_json(self) -> dict[str, str]:
        d = asdict(self)
        d["message"] = str(self)
        return d


def _fix(group: str) -> str:
    return f"run dfo deploy --group {group}"


def _short(v: Any) -> str:
    if v is None:
        return "none"
    s = str(v)
    return s[:12] if len(s) == 64 else s  # a sha256 reads as its first 12


def env_differences(group: str, hosts: Sequence[str],
                    fingerprints: Mapping[str, EnvFingerprint | None]) -> list[Difference]:
    """Each member whose deployed env differs from the head's (``hosts[0]``).

    ``fingerprints[host]`` is the host's ``envs/current/fingerprint.json`` (None: no env
    deployed; a host missing from the mapping was not reached and is not judged). When the
    head has no env, every member is told so against the head."""
    head = hosts[0]
    fix = _fix(group)
    out: list[Difference] = []
    if head in fingerprints and fingerprints[head] is None:
        out.append(Difference(head, head, NO_ENV, fix))
        return out
    ref = fingerprints.get(head)
    for h in hosts[1:]:
        if h not in fingerprints:
            continue
        fp = fingerprints[h]
        if fp is None:
            out.append(Difference(h, head, NO_ENV, fix))
            continue
        if ref is None:
            continue
        diffs = [f"{label} {_short(fp.value(k))} vs {_short(ref.value(k))}"
                 for k, label in ENV_FIELDS if fp.value(k) != ref.value(k)]
        if diffs:
            out.append(Difference(h, head, "; ".join(diffs), fix))
    return out


def profile_differences(group: str, hosts: Sequence[str], configured: Mapping[str, str],
                        deployed: Mapping[str, str | None]) -> list[Difference]:
    """Members whose hosts.yaml profile differs from the head's, or whose deployed env was
    built from another profile than hosts.yaml gives them (``deployed[h]`` None or absent:
    nothing deployed or not reached; ``env_differences`` says so)."""
    head = hosts[0]
    out: list[Difference] = []
    for h in hosts:
        if h != head and configured.get(h) != configured.get(head):
            out.append(Difference(h, head, f"hosts.yaml gives profile {configured.get(h)} vs "
                                           f"{configured.get(head)}",
                                  f"set one `profile:` on every member of {group} in hosts.yaml"))
            continue
        dep = deployed.get(h)
        if dep is not None and dep != configured.get(h):
            out.append(Difference(h, head, f"its env is profile {dep}, hosts.yaml says "
                                           f"{configured.get(h)}", _fix(group)))
    return out


# ------------------------------------------------------------------ head reachability

def listen_argv(python: str, addr: str, ports: Sequence[int], expected: int,
                seconds: float = LISTEN_S) -> list[str]:
    """The head's short-lived listener on ``addr`` at each port (argv: no shell)."""
    return [python, "-c", remote_source("port_probe"), "listen", addr,
            ",".join(str(p) for p in ports), f"{seconds:g}", str(expected)]


def connect_argv(python: str, addr: str, ports: Sequence[int], hello: str,
                 timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """A member's connection to the head on each port; ``hello`` ``stop`` ends the listener."""
    return [python, "-c", remote_source("port_probe"), "connect", addr,
            ",".join(str(p) for p in ports), f"{timeout:g}", hello]


def parse_port_lines(lines: Iterable[str]) -> list[PortRecord]:
    """The probe's ``@dfo-port`` records, in order (other lines, bad JSON and objects that
    are not such a record skipped)."""
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith(PORT_MARK):
            continue
        d = json_object(line[len(PORT_MARK):])
        try:
            if d is not None:
                out.append(PortRecord.from_json(d))
        except ContractError:
            continue
    return out


@dataclass(frozen=True)
class Reach:
    """One member's verdict: ``ok``, or ``message`` saying what is wrong."""

    host: str
    ok: bool
    message: str = ""
    role: str = "member"   # "head" | "member"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bind_problems(head: str, addr: str, records: Sequence[PortRecord]) -> list[str]:
    """Why the head could not listen (a port taken, an address not its own), one line each."""
    out = []
    for r in records:
        if r.event != "bind" or r.ok:
            continue
        port, err, name = r.port, r.error or "?", r.errno or ""
        if name == "EADDRINUSE":
            out.append(f"port {port} is already taken on {head} ({addr}:{port}: {err}; "
                       f"a run of this group, or another program, holds it)")
        elif name == "EADDRNOTAVAIL":
            out.append(f"{addr} is not an address of {head} (cannot listen on {addr}:{port}: "
                       f"{err}); fix head_addr in hosts.yaml")
        else:
            out.append(f"cannot listen on {addr}:{port} on {head}: {err}")
    return out


def judge_reach(head: str, addr: str, ports: Sequence[int],
                listen_records: Sequence[PortRecord] | None, listen_error: str | None,
                members: Mapping[str, Sequence[PortRecord] | str]) -> list[Reach]:
    """The verdict per member, the head first.

    ``listen_records``: what the head's listener printed (None: it never ran);
    ``listen_error``: why it could not start; ``members[h]``: the records of h's connection
    attempt, or a string saying why it could not run there."""
    out: list[Reach] = []
    bound = {r.port for r in listen_records or () if r.event == "bind" and r.ok}
    problems = bind_problems(head, addr, listen_records or ())
    if listen_error or listen_records is None:
        out.append(Reach(head, False, f"cannot start a listener on {head}: "
                                      f"{listen_error or 'no output'}", "head"))
    elif problems:
        out.append(Reach(head, False, "; ".join(problems), "head"))
    else:
        out.append(Reach(head, True, f"listening on {addr}:" + ",".join(map(str, ports)), "head"))
    for h, recs in members.items():
        if isinstance(recs, str):
            out.append(Reach(h, False, f"cannot reach {addr}:{ports[0]} from {h}: {recs}"))
            continue
        bad = []
        for port in ports:
            if port not in bound:
                continue  # the head could not listen there: said above
            r = next((x for x in recs if x.event == "connect" and x.port == port), None)
            if r is None:
                bad.append(f"cannot reach {addr}:{port} from {h}: the probe printed nothing")
            elif not r.ok:
                bad.append(f"cannot reach {addr}:{port} from {h}: {r.error or r.errno}")
        if not bound:
            out.append(Reach(h, False, f"not tried: the head listens on none of "
                                       f"{addr}:{','.join(map(str, ports))}"))
        elif bad:
            out.append(Reach(h, False, "; ".join(bad)))
        else:
            out.append(Reach(h, True, f"reaches {addr}:" + ",".join(str(p) for p in ports if p in bound)))
    return out
