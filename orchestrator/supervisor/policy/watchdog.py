"""The attempt watchdog: pure decisions about one running trainer attempt.

The supervisor reads the attempt's output, feeds each complete line with
:meth:`AttemptWatchdog.feed`, calls :meth:`AttemptWatchdog.tick` once per poll (and
:meth:`AttemptWatchdog.stop` when ``dfo stop`` asked),
and executes the actions it gets back, in order. The watchdog itself never reads a file,
sends a signal or looks at a clock: time comes in as ``now`` (monotonic seconds).

What it decides:

- a line matching a *live* classifier rule (OOM, FX race, NCCL timeout, ...): warn, then after
  ``live_grace_s`` ask the trainer to stop (SIGTERM; it checkpoints), then kill it
  ``kill_grace_s`` later. A dense-attention fallback is acted on at once (no grace) and given
  ``stop_timeout_s`` to checkpoint, unless the run asked for uncompiled flex on purpose;
- a throughput collapse (:class:`~orchestrator.common.classify.ThroughputMonitor`) is *not*
  dense attention by itself (flex's dense-path lines are acted on when printed, above):
  the watchdog only reports it
  (:class:`ThroughputDrop`, later :class:`ThroughputBack`): the supervisor looks at the host
  (``supervisor.policy.host_load``) and records what it saw, the config stays and nothing is restarted;
- a hang, two ways: no ``@dfo`` marker (heartbeat, step, phase) for ``hang_s`` (60) while
  the attempt's whole process tree used under 10% of one core and did no I/O in that time
  (the supervisor feeds :meth:`AttemptWatchdog.activity`; a compile that makes progress burns CPU
  and the trainer's heartbeat goes on); or no marker at all for ``warmup_s`` (before the
  first step) or ``train_s`` (after it), busy or not. Either: dump the stacks, then kill;
- a frozen attempt: a process of its tree stopped (``/proc/PID/stat`` state T or t: SIGSTOP,
  job control, a debugger) for ``frozen_s`` with no progress for as long, or when a hang
  would be judged while one is stopped: it runs no code, so this is no compile and no hang
  of the trainer's own. Kill it (SIGKILL ends a stopped process) and say so (``frozen``);
  no stacks (it cannot answer);
- a stop request: SIGTERM, and a kill ``stop_timeout_s`` later;
- once a kill is due it is repeated every 2 s until the process is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from dfo_contract.trainer_markers import CheckpointMarker, EvalMarker, StepMarker, read_marker
from dfo_contract.runlimits import Thresholds  # noqa: F401  (the watchdog's limits: spec.json's)

from ...common.own_trainer import match_step
from ...common.goodput import AttemptClock
from ...common.classify import LineScan, TailScan, ThroughputMonitor

#: a kill that did not take is repeated after this many seconds
KILL_REPEAT_S = 2.0


# --- actions (what the supervisor must do, in order) ---------------------------------------

# A ``CheckpointMarker`` is itself the action "record it" (state.json's last_checkpoint and
# a ``checkpoint`` event); an ``EvalMarker`` (bundled trainer) likewise: the measured
# acceptance length on held-out data and the best so far (state.json's accept_len /
# best_accept_len and an ``eval`` event).

@dataclass(frozen=True)
class StepProgress:
    """A step marker: record progress (state.json's last_step / tokens_per_s / baseline)."""
    step: int | None
    tokens_per_s: float | None
    baseline: float | None


@dataclass(frozen=True)
class Warn:
    """Emit a ``watchdog`` event with this reason."""
    reason: str


@dataclass(frozen=True)
class Terminate:
    """SIGTERM the trainer: it saves a checkpoint and exits."""
    reason: str


@dataclass(frozen=True)
class DumpStacks:
    """Keep the hung attempt's stacks (before the kill that follows)."""
    reason: str


@dataclass(frozen=True)
class Kill:
    """SIGKILL the attempt's whole process tree."""
    reason: str


@dataclass(frozen=True)
class ThroughputDrop:
    """tokens/s collapsed with no dense-attention evidence: find out why (host load, other
    GPU processes) and record it (a ``throughput_low`` event); no restart, no config
    change."""
    reason: str


@dataclass(frozen=True)
class ThroughputBack:
    """tokens/s is back above the collapse fraction after a :class:`ThroughputDrop` (a
    ``throughput_ok`` event)."""
    reason: str


Action = Union[StepProgress, CheckpointMarker, EvalMarker, Warn, Terminate, DumpStacks, Kill,
               ThroughputDrop, ThroughputBack]

#: a silent attempt whose tree used less CPU than this fraction of one core over ``hang_s``
IDLE_CPU_FRACTION = 0.1
#: ... and read/wrote fewer bytes than this in that time, is stuck
IDLE_IO_BYTES = 1 << 20


class AttemptWatchdog:
    """One attempt's watchdog. ``now`` is when the attempt started (monotonic seconds);
    ``baseline`` a healthy tokens/s already measured for this config (else it is learned);
    ``dense_expected``: the run asked for uncompiled flex, so the dense warning is no fault."""

    def __init__(self, thresholds: Thresholds, *, now: float, baseline: float | None = None,
                 dense_expected: bool = False, step_pattern: re.Pattern | None = None,
                 cpu_is_progress: bool = False, wall: float | None = None):
        self.thresholds = thresholds
        #: epoch seconds minus monotonic ones (``wall``: the epoch seconds at ``now``), for
        #: the attempt's clock of step reports that carry no time of their own
        self._to_wall = (wall if wall is not None else now) - now
        self.clock = AttemptClock()
        self.dense_expected = dense_expected
        #: your own trainer (``dfo launch -- CMD``): lines matching this are steps, and
        #: the process tree's CPU time advancing is progress (it prints no heartbeats)
        self.step_pattern = step_pattern
        self.cpu_is_progress = cpu_is_progress
        self.scan: LineScan = TailScan()
        self.monitor = ThroughputMonitor(fraction=thresholds.collapse_fraction,
                                         steps=thresholds.collapse_steps,
                                         baseline_steps=thresholds.baseline_steps,
                                         skip_steps=thresholds.skip_steps)
        if baseline:
            self.monitor.baseline = float(baseline)
        self.last_progress = now
        self.first_step_at: float | None = None
        self.reached_train = False
        self.hang: str | None = None
        #: the reason when the attempt was killed because a process of it sat stopped
        self.frozen: str | None = None
        self.stopped_pids: tuple[int, ...] = ()
        self.stopped_since: float | None = None
        #: processes of the attempt stopped on another node of a group (its host, its pids,
        #: since when by this clock): a hang due meanwhile is that node's freeze
        self.elsewhere: tuple[str, tuple[int, ...], float] | None = None
        #: the node whose stopped processes made this attempt ``frozen`` (None: this one's)
        self.frozen_on: str | None = None
        self.collapse: str | None = None     # (reported in Outcome; a collapse does not kill)
        self.low: str | None = None          # throughput low without dense evidence (now)
        self.low_episodes = 0
        #: (t, cpu seconds, io bytes) of the process tree, oldest first (see activity)
        self.samples: list[tuple[float, float, int]] = []
        self.stopping = False
        self.term_at: float | None = None   # when to SIGTERM (a fatal line or a collapse)
        self.kill_at: float | None = None   # when to (re-)send SIGKILL

    # --- input ------------------------------------------------------------------------------
    def feed(self, line: str, now: float, wall: float | None = None) -> list[Action]:
        """One complete line of the attempt's output (``wall``: the epoch seconds at
        ``now``, for the times the trainer's markers carry)."""
        acts: list[Action] = []
        m = read_marker(line)               # each line parsed once, here
        rule = self.scan.feed(line, marker=m)
        if m is None and self.step_pattern is not None:
            m = match_step(self.step_pattern, line)
        if m is not None:
            self.last_progress = now
            self.clock.feed(m, now + self._to_wall, wall)
            if isinstance(m, StepMarker):
                acts += self._on_step(m, now)
            elif isinstance(m, (CheckpointMarker, EvalMarker)):
                acts.append(m)
        if rule is not None and rule.live and self.term_at is None and self.kill_at is None:
            if rule.cls == "dense_fallback" and self.dense_expected:
                return acts
            grace = 0.0 if rule.cls == "dense_fallback" else self.thresholds.live_grace_s
            acts.append(Warn(f"{rule.cls} seen in the output ({rule.name})"))
            self.term_at = now + grace
        return acts

    def _on_step(self, m: StepMarker, now: float) -> list[Action]:
        if self.first_step_at is None:
            self.first_step_at = now
        self.reached_train = True
        tps = m.tokens_per_s
        why = self.monitor.observe(tps)
        acts: list[Action] = []
        # dense-path lines are acted on when they are printed (a live rule); a collapse
        # alone is only reported
        if why and self.low is None and self.term_at is None:
            self.low = why
            self.low_episodes += 1
            acts.append(ThroughputDrop(why))
        elif self.low is not None and self.monitor.low_steps == 0:
            acts.append(ThroughputBack(f"{tps:.0f} tok/s, baseline {self.monitor.baseline:.0f}"))
            self.low = None
        acts.append(StepProgress(m.step, tps, self.monitor.baseline))
        return acts

    def activity(self, now: float, cpu_s: float, io_bytes: int = 0,
                 stopped: tuple[int, ...] = ()) -> None:
        """The attempt's process tree has used ``cpu_s`` CPU seconds and moved ``io_bytes``
        so far (cumulative; the supervisor samples it about once a second); ``stopped``: the
        pids of the tree that are stopped (state T/t) now."""
        if stopped:
            if self.stopped_since is None:
                self.stopped_since = now
        else:
            self.stopped_since = None
        self.stopped_pids = tuple(stopped)
        if self.cpu_is_progress and self.samples:
            t0, c0, _ = self.samples[-1]
            if now > t0 and cpu_s - c0 >= IDLE_CPU_FRACTION * (now - t0):
                self.last_progress = now
        self.samples.append((now, float(cpu_s), int(io_bytes)))
        window = self.thresholds.hang_s
        while len(self.samples) > 2 and self.samples[1][0] <= now - window:
            del self.samples[0]

    def stopped_elsewhere(self, now: float, host: str | None, pids: tuple[int, ...] = ()) -> None:
        """What another node of the group reports of its part of the attempt: ``pids`` stopped
        there now (none: ``host`` None or no pids). A peer's processes are that node's to
        judge after ``frozen_s``; here they only make a hang that comes due meanwhile
        ``frozen`` on that node, not this node's hang."""
        if not host or not pids:
            self.elsewhere = None
        elif self.elsewhere is None or self.elsewhere[0] != host:
            self.elsewhere = (host, tuple(pids), now)
        else:
            self.elsewhere = (host, tuple(pids), self.elsewhere[2])

    def _activity_in(self, now: float, window: float) -> tuple[float, int] | None:
        """(CPU seconds, bytes) the tree used in the last ``window`` seconds; None when the
        samples do not cover that long yet."""
        base = None
        for s in self.samples:
            if s[0] <= now - window:
                base = s
            else:
                break
        if base is None:
            return None
        last = self.samples[-1]
        return last[1] - base[1], last[2] - base[2]

    def stop(self, now: float) -> list[Action]:
        """``dfo stop`` asked: let the trainer checkpoint, kill it if it takes too long."""
        if self.stopping:
            return []
        self.stopping = True
        self.kill_at = now + self.thresholds.stop_timeout_s
        return [Terminate("stop requested")]

    def tick(self, now: float) -> list[Action]:
        """The clock moved (once per poll, after the new lines were fed)."""
        acts: list[Action] = []
        if self.term_at is not None and now >= self.term_at and self.kill_at is None:
            slow = self.collapse is not None or "dense_fallback" in self.scan.hits
            self.kill_at = now + (self.thresholds.stop_timeout_s if slow else self.thresholds.kill_grace_s)
            acts.append(Terminate("a fatal line or a throughput collapse"))
        limit = self.thresholds.train_s if self.reached_train else self.thresholds.warmup_s
        silent = now - self.last_progress
        phase = "training" if self.reached_train else "warm-up/compile"
        if self.kill_at is None and self.term_at is None:
            acts += self._frozen(now, silent, limit)
        if self.kill_at is None and self.term_at is None:
            if silent > limit:
                self.hang = f"{silent:.0f}s without progress during {phase} (threshold {limit:g}s)"
            elif self.thresholds.hang_s > 0 and silent > self.thresholds.hang_s:
                used = self._activity_in(now, self.thresholds.hang_s)
                if used is not None and used[0] < IDLE_CPU_FRACTION * self.thresholds.hang_s \
                        and used[1] < IDLE_IO_BYTES:
                    self.hang = (f"{silent:.0f}s without progress during {phase}, the process "
                                 f"tree idle ({used[0]:.1f} CPU-s, {used[1]} bytes of I/O in the "
                                 f"last {self.thresholds.hang_s:g}s; threshold hang_s {self.thresholds.hang_s:g}s)")
            if self.hang:
                acts += [Warn(self.hang), DumpStacks(self.hang), Kill(self.hang)]
                self.kill_at = now
        if self.kill_at is not None and now >= self.kill_at:
            if not (acts and isinstance(acts[-1], Kill)):
                acts.append(Kill("the attempt did not end in time"))
            self.kill_at = now + KILL_REPEAT_S
        return acts

    def _frozen(self, now: float, silent: float, limit: float) -> list[Action]:
        """A process of the tree stopped for ``frozen_s`` (or a hang is due meanwhile); or,
        a hang due while another node reports its processes stopped, that node's."""
        hang_due = silent > limit or (self.thresholds.hang_s > 0 and silent > self.thresholds.hang_s)
        frozen_s = float(self.thresholds.frozen_s)
        if self.stopped_since is not None:
            where, stopped, held = "", self.stopped_pids, now - self.stopped_since
            if not ((frozen_s > 0 and held >= frozen_s and silent >= frozen_s) or hang_due):
                return []
        elif self.elsewhere is not None and hang_due and frozen_s > 0:
            host, stopped, since = self.elsewhere
            where, held, self.frozen_on = f"node {host}: ", now - since, host
        else:
            return []
        pids = ", ".join(str(p) for p in stopped)
        what = "process" if len(stopped) == 1 else "processes"
        self.frozen = (f"{where}{what} {pids} of the attempt stopped (state T: SIGSTOP, job "
                       f"control or a debugger) for {held:.0f}s, no progress for {silent:.0f}s: "
                       "frozen from outside, not a compile or a hang of its own; killed")
        self.hang = self.frozen
        self.kill_at = now
        return [Warn(self.frozen), Kill(self.frozen)]

    # --- result -------------------------------------------------------------------------------
    def healthy_s(self, end: float) -> float:
        """Seconds of healthy training (from the first step; 0 after a collapse)."""
        if self.first_step_at is None or self.collapse is not None:
            return 0.0
        return end - self.first_step_at
