"""Who built a compile-cache snapshot, and whether this host takes it (pure).

A snapshot carries ``.so`` files and Python that torch loads and runs: adopting one that
another machine built means running that machine's code. Its manifest records who built
it (``provenance``: ``dfo_contract.cache_records.Provenance``); a host takes a snapshot it
did not build only when told so (``--trust-other-hosts``, or ``cache.trusted_sources`` in
hosts.yaml), and then records the adoption in its own store copy (``adopted``:
``Adoption``). The record is not a signature: it stops an accident, not someone who can
edit the manifest and the host's store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from dfo_contract.cache_records import Adoption, Manifest, Provenance
from dfo_contract.env_fingerprint import EnvFingerprint

from ..common.errors import CacheError


def build_provenance(*, host: str, machine: str | None, fingerprint: EnvFingerprint, key: str,
                     created: float, dfo: str) -> Provenance:
    """Who built a snapshot: the host as dfo's inventory names it, the machine's own name,
    the env (profile and lock), the cache key, python/torch and dfo versions, when (UTC)."""
    lock = fingerprint.lock_hash
    return Provenance(host=host, machine=machine,
                      env=(f"{fingerprint.profile or '?'}-{lock[:12]}" if lock
                           else fingerprint.profile or None),
                      cache_key=key, python=fingerprint.python, torch=fingerprint.torch, dfo=dfo,
                      created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)))


@dataclass(frozen=True)
class Trust:
    """Whom this host takes snapshots from: itself always; the hosts named in hosts.yaml's
    ``cache.trusted_sources``; anyone with ``--trust-other-hosts``."""

    host: str
    machine: str | None = None
    trusted_sources: tuple[str, ...] = ()
    trust_other_hosts: bool = False


def builder(prov: Provenance | None) -> str | None:
    """``host`` (``machine``) that built a snapshot (its manifest's ``provenance``), for
    messages; None when unrecorded."""
    if prov is None or not prov.host:
        return None
    mach = prov.machine
    return f"{prov.host} (machine {mach})" if mach and mach != prov.host else prov.host


def _own(rec: Provenance | Adoption | None, trust: Trust) -> bool:
    if rec is None or rec.host != trust.host:
        return False
    mach = rec.machine
    return not (mach and trust.machine and mach != trust.machine)


def trust_reason(manifest: Manifest, trust: Trust, *, stored: bool = False) -> str | None:
    """Why ``trust`` accepts this snapshot (``built here``, ``adopted here``, ``trusted
    source gpu1``, ``--trust-other-hosts``); None: it does not. ``stored``: the manifest is the
    host's own store copy, where an earlier explicit adoption (``adopted``) counts."""
    prov = manifest.provenance
    if _own(prov, trust):
        return "built here"
    if stored and _own(manifest.adopted, trust):
        return "adopted here"
    if prov is not None and prov.host and (prov.host in trust.trusted_sources
                                           or (prov.machine and prov.machine in trust.trusted_sources)):
        return f"trusted source {prov.host}"
    if trust.trust_other_hosts:
        return "--trust-other-hosts"
    return None


def check_trust(manifest: Manifest, trust: Trust, source: str, *, stored: bool = False) -> str:
    """Refuse (one line, exit 8) a snapshot this host did not build unless it is adopted
    explicitly; returns why it is accepted."""
    why = trust_reason(manifest, trust, stored=stored)
    if why:
        return why
    who = builder(manifest.provenance)
    built = f"was built on {who}" if who else "records no builder (made by an older dfo, or edited)"
    src = manifest.provenance.host if manifest.provenance else None
    cfg = f", or list {src} in hosts.{trust.host}.cache.trusted_sources in hosts.yaml" if src else ""
    raise CacheError(f"snapshot {source} {built}, not on {trust.host}; it carries compiled code "
                     f"(.so) that torch loads, so using it means running that host's code",
                     hint=f"if you trust it, adopt it with --trust-other-hosts{cfg}")


def adoption_record(manifest: Manifest, trust: Trust, how: str, now: float) -> Manifest:
    """``manifest`` as this host stores it after an explicit adoption (``adopted`` set;
    an incoming ``adopted`` is never believed)."""
    adopted = None
    if how != "built here":
        adopted = Adoption(host=trust.host, machine=trust.machine,
                           source=builder(manifest.provenance), how=how,
                           at_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    return replace(manifest, adopted=adopted)
