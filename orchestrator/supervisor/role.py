"""This node's part in its run (spec ``role``), chosen once when the supervisor starts:
:class:`SoloRole` (a run on one host: every hook does nothing), or one node of a run over
several nodes (``supervisor.group``: ``GroupHead``, ``GroupMember``).

The supervisor calls the role's hooks at fixed points of its attempt loop and its watch;
the :class:`Role` protocol lists them. A role drives the run through :meth:`Role.run`: the
solo run and the head run the supervisor's attempt loop (:class:`Driver`), a member waits
for the head's plans and runs each attempt through the same driver steps.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from dfo_contract.runlimits import Thresholds
from dfo_contract.state_records import CheckpointRef, EvidenceLine, FallbackRecord, Overrides

from ..common.classify import Diagnosis
from ..common.launch_argv import Rendezvous

if TYPE_CHECKING:   # the watch's types: supervisor.watch imports nothing of the roles
    from .policy.watchdog import AttemptWatchdog
    from .run_cache import RunCache
    from .watch import Outcome

#: how the run ends: (status, reason) for ``Driver.final``
Ending = tuple[str, str]


@dataclass(frozen=True)
class Placement:
    """This node's part of attempt N (the bundled trainer): the checkpoint it resumes,
    torchrun's rendezvous, the env it adds and its processes (None: as the layout says)."""
    resume: str | None
    rdzv: Rendezvous | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    nproc: int | None = None


#: the class and reason a node gives its end of an attempt, from the attempt's diagnosis
Naming = Callable[[Diagnosis], tuple[str, str]]


class Driver(Protocol):
    """What a role drives: the supervisor's attempt loop and its steps, which write an
    attempt's lifecycle into the run's state (its status, config, record and class, the
    fallbacks)."""

    def loop(self) -> int: ...

    def run_attempt(self, n: int, overrides: Overrides | None = None) -> "Outcome":
        """Start attempt N (with ``overrides``: that config; None: the run's) and watch it
        to its end."""

    def judge(self, n: int, out: "Outcome", *, name: Naming | None = None) -> Diagnosis:
        """Attempt N's diagnosis, recorded as the attempt's class and in its ``classified``
        event (``name``: the class and reason this node gives its end instead)."""

    def next_config(self, overrides: Overrides,
                    fallback: FallbackRecord | None) -> None:
        """The run's decision on the last attempt: the config the next one runs and the
        fallback that made it (None: none)."""

    def backoff(self, delay_s: float = 0.0) -> None:
        """The run waits ``delay_s`` before its next attempt (saved)."""

    def follow(self, last_checkpoint: CheckpointRef | None, last_step: int | None) -> None:
        """Another node's progress (checkpoint, step) is the run's."""

    def attempt_decided(self, n: int) -> None:
        """Attempt N is decided without a trainer of this node: the next is N+1."""

    #: the run's own compile cache
    cache: "RunCache"

    def final(self, status: str, reason: str,
              evidence: list[EvidenceLine] | None = None) -> int: ...


class Role(Protocol):
    #: one node of several (torchrun; never served by a standby)
    multinode: bool

    def open(self) -> None:
        """The run starts (its state saved as running)."""

    def run(self, driver: Driver) -> int:
        """Drive the run to its end."""

    def thresholds(self, t: Thresholds) -> Thresholds:
        """The watchdog's limits on this node."""

    def place(self, n: int, find_resume: Callable[[], str | None]) -> Placement:
        """This node's part of attempt N; ``find_resume`` is the source's checkpoint."""

    def tick(self, n: int, proc: subprocess.Popen, out: "Outcome", dog: "AttemptWatchdog",
             now: float) -> None:
        """Once per poll of the watch."""

    def after_watch(self, n: int, out: "Outcome", dog: "AttemptWatchdog") -> None:
        """Attempt N's process tree is gone."""

    def settle(self, n: int, out: "Outcome", diag: Diagnosis) -> tuple[Diagnosis, Ending | None]:
        """Attempt N ended and was classified here: the run's diagnosis, and how the run
        ends when that is already decided."""

    def clears_caches(self, n: int) -> bool:
        """The restart after attempt N clears the compile cache of another node (the next
        attempt changes there)."""

    def sync_stop(self) -> None:
        """While waiting between attempts: pass a stop on, or take one from elsewhere."""

    def on_restart(self, n: int, fallback: object, restart: object) -> None:
        """The run restarts after attempt N (``Fallback`` and ``Restart`` events)."""

    def on_final(self, status: str, reason: str) -> None:
        """The run ends; the run lock is still held."""

    def release(self) -> None:
        """Let go of what the role holds (once; before the final status is written)."""

    def restarted(self, attempt: int, abandoned: bool) -> str | None:
        """A supervisor restarted after its predecessor died (during ``attempt`` when
        ``abandoned``: it ended that attempt unfinished): why the run cannot go on (None: it
        goes on with a new attempt)."""


class SoloRole:
    """A run on one host."""
    multinode = False

    def open(self) -> None:
        pass

    def run(self, driver: Driver) -> int:
        return driver.loop()

    def thresholds(self, t: Thresholds) -> Thresholds:
        return t

    def place(self, n: int, find_resume: Callable[[], str | None]) -> Placement:
        return Placement(find_resume())

    def tick(self, n: int, proc: subprocess.Popen, out: "Outcome", dog: "AttemptWatchdog",
             now: float) -> None:
        pass

    def after_watch(self, n: int, out: "Outcome", dog: "AttemptWatchdog") -> None:
        pass

    def settle(self, n: int, out: "Outcome", diag: Diagnosis) -> tuple[Diagnosis, Ending | None]:
        return diag, None

    def clears_caches(self, n: int) -> bool:
        return False

    def sync_stop(self) -> None:
        pass

    def on_restart(self, n: int, fallback: object, restart: object) -> None:
        pass

    def on_final(self, status: str, reason: str) -> None:
        pass

    def release(self) -> None:
        pass

    def restarted(self, attempt: int, abandoned: bool) -> str | None:
        return None
