"""Follow one group run on every node at once (``dfo logs [-f] --group NAME``).

One ``LogFollower`` per node, each in its own thread with its own transport, so each node
reconnects on its own as ``dfo logs`` does today; their lines are handed on one at a time
(``on_line(host, line)``, serialized by a lock) for the caller to print with a node prefix.
With ``-f`` it ends when every node's run is final. A node that cannot be followed (its
error) never hides the others' lines. Ctrl-C only stops this side.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from ..common.errors import DfoError
from .group import HostOutcome
from .logs import LogFollower, LogLine

log = logging.getLogger("dfo")


def follow_group(nodes: Sequence[tuple[str, Any, Any]], run_id: str, *,
                 on_line: Callable[[str, LogLine], None], follow: bool = False,
                 from_attempt: int = 1, attempt: int | None = None, since: float | None = None,
                 on_reconnect: Callable[[str, int, str], None] | None = None,
                 on_skipped: Callable[[str, int], None] | None = None,
                 poll: float = 0.25) -> list[HostOutcome[str]]:
    """Follow ``run_id`` on every ``(host name, transport, layout)``; one outcome per node in
    order, its value the run's status when its follower ended."""
    lock = threading.Lock()
    outcomes: list[HostOutcome[str]] = [HostOutcome(host=name) for name, _, _ in nodes]

    def one(i: int, name: str, t: Any, layout: Any) -> None:
        def deliver(ln: LogLine) -> None:
            with lock:
                on_line(name, ln)

        def reconnect(n: int, why: str) -> None:
            if on_reconnect is not None:
                with lock:
                    on_reconnect(name, n, why)

        def skipped(n: int) -> None:
            if on_skipped is not None:
                with lock:
                    on_skipped(name, n)

        try:
            f = LogFollower(t, layout, run_id, on_line=deliver, follow=follow, attempt=attempt,
                            from_attempt=from_attempt, since=since, on_reconnect=reconnect,
                            on_skipped=skipped, poll=poll)
            outcomes[i].value = f.run()
        except DfoError as e:
            log.info("%s: %s", name, e)
            outcomes[i].error, outcomes[i].exit_code = str(e), e.exit_code

    threads = [threading.Thread(target=one, args=(i, name, t, layout), daemon=True,
                                name=f"dfo-logs-{name}")
               for i, (name, t, layout) in enumerate(nodes)]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive():      # join in slices: Ctrl-C reaches this thread at once
            th.join(0.5)
    return outcomes
