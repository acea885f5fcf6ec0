"""Acting on every member of a ``hosts.yaml`` group at once (``--group NAME``).

``for_each_host`` runs one function per host in parallel threads (one transport, i.e. one
connection, each) and returns one ``HostOutcome`` per host in the group's order. A host that
fails never hides the others' results: its ``DfoError`` is kept (message and exit code) and
the rest go on. The caller turns the outcomes into a summary table and one exit code
(``worst_exit``).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from ..common.errors import DfoError

log = logging.getLogger("dfo")
T = TypeVar("T")


@dataclass
class HostOutcome(Generic[T]):
    host: str
    value: T | None = None
    error: str | None = None      # the DfoError's one-line message
    exit_code: int = 0            # the DfoError's exit code (0: ok)

    @property
    def ok(self) -> bool:
        return self.error is None


def for_each_host(hosts: Sequence[Any], fn: Callable[[Any], T], *,
                  max_workers: int | None = None) -> list[HostOutcome[T]]:
    """``fn(host)`` for every HostConfig in ``hosts``, in parallel; outcomes in input order.
    Only ``DfoError`` is caught (a bug elsewhere still raises, with its traceback)."""
    def one(h) -> HostOutcome[T]:
        try:
            return HostOutcome(host=h.name, value=fn(h))
        except DfoError as e:
            log.info("%s: %s", h.name, e)
            return HostOutcome(host=h.name, error=str(e), exit_code=e.exit_code)

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=max_workers or len(hosts),
                            thread_name_prefix="dfo-host") as ex:
        return list(ex.map(one, hosts))


def worst_exit(outcomes: Sequence[HostOutcome]) -> int:
    """The exit code of a group command: 0 when every host succeeded, else the first failing
    host's code (outcomes are in the group's order, so it is stable)."""
    for o in outcomes:
        if not o.ok:
            return o.exit_code or 1
    return 0
