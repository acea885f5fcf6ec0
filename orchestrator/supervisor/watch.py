"""Watching one attempt: read its log by byte offset, feed the watchdog, sample the process
tree and the host, and execute the watchdog's actions (dump stacks, SIGTERM, kill, record a
throughput drop). :class:`AttemptWatch` is given what it needs (:class:`WatchInputs`): the
run's record, the stop request, the source's step pattern, the standby keeper, the role's
hooks; the supervisor owns the decisions between attempts."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from dfo_contract import events
from dfo_contract.runlimits import Thresholds
from dfo_contract.runspec import Bundled
from dfo_contract.trainer_markers import CheckpointMarker, EvalMarker

from .policy import watchdog as wd
from ..common.own_trainer import compile_step_pattern
from ..common.classify import LineScan, TailScan
from ..common.goodput import AttemptClock
from .policy.host_load import HostSample, judge_drop, settled
from . import hostprobe, procs, runfiles
from .lines import read_lines
from .record import RunRecord, Stop
from .stacks import dump_stacks

#: how often the attempt's tree and the host are sampled, and how far back a throughput
#: drop is compared (the steps that collapsed took about this long)
SAMPLE_S = 1.0
HOST_WINDOW_S = 30.0


@dataclass
class Outcome:
    """How one attempt ended on this node, as its watch saw it (what a role keeps of its
    part in the attempt is the role's)."""
    exit_code: int | None = None
    signal: int | None = None
    hang: str | None = None
    frozen: str | None = None
    collapse: str | None = None
    stopped: bool = False
    reached_train: bool = False
    healthy_s: float = 0.0
    duration_s: float = 0.0
    oom_killed: bool = False
    #: what says the kernel's OOM killer ended it (a kernel log line, a cgroup counter)
    oom_reason: str | None = None
    #: every pid of the attempt's process tree the samples saw
    pids_seen: set = field(default_factory=set)
    scan: LineScan = field(default_factory=TailScan)
    #: where the attempt's time went (its ``attempt_end``'s timing fields)
    clock: AttemptClock = field(default_factory=AttemptClock)
    stacks: list[str] = field(default_factory=list)
    #: the attempt's process tree (TreeMeter) and the host, sampled about once a second
    meter: hostprobe.TreeMeter = field(default_factory=hostprobe.TreeMeter)
    host: list[HostSample] = field(default_factory=list)
    #: a throughput drop whose host judgement waits for the samples after it
    #: (supervisor.policy.host_load.settled): (reason, monotonic t, wall t)
    low_pending: tuple[str, float, float] | None = None


class StandbyView(Protocol):
    """What the watch asks of the standby keeper (supervisor.standby.Keeper)."""

    def early(self) -> bool: ...
    def on_train(self, n: int) -> None: ...
    def poll(self) -> None: ...
    def importing(self) -> bool: ...
    def pids(self) -> list[int]: ...


@dataclass(frozen=True)
class WatchInputs:
    run_dir: str
    python: str                          # the env's interpreter (stack dumps)
    thresholds: Thresholds               # this node's (the role's)
    record: RunRecord                    # state.json and events.jsonl
    stop: Stop
    bundled: Callable[[], Bundled | None]     # the bundled trainer's part in force
    step_pattern: str | None             # the source's step lines (None: @dfo markers)
    cpu_is_progress: bool                # the source's trainer prints no heartbeats
    standby: StandbyView
    #: the role's hooks: once per poll (n, proc, out, dog, now); once the tree is gone
    tick: Callable[[int, subprocess.Popen, "Outcome", wd.AttemptWatchdog, float], None]
    after: Callable[[int, "Outcome", wd.AttemptWatchdog], None]


class AttemptWatch:
    """Watches attempts, one at a time (:meth:`watch`)."""

    def __init__(self, inputs: WatchInputs):
        self.i = inputs

    def watch(self, n: int, proc: subprocess.Popen, log_path: str) -> Outcome:
        """Read the attempt's new lines, feed them to the watchdog, do what it says."""
        i, state, sb = self.i, self.i.record.state, self.i.standby
        t0 = time.monotonic()
        base = state.baseline_tokens_per_s
        part = i.bundled()   # dense_expected: uncompiled flex on purpose
        dog = wd.AttemptWatchdog(i.thresholds, now=t0,
                          baseline=base if state.baseline_overrides == state.overrides
                          else None,
                          dense_expected=part is not None and part.dense_expected,
                          step_pattern=compile_step_pattern(i.step_pattern),
                          cpu_is_progress=i.cpu_is_progress, wall=time.time())
        out = Outcome(scan=dog.scan, clock=dog.clock)
        poll = float(i.thresholds.poll_s)
        offset = 0
        next_sample = t0
        early = sb.early()
        while True:
            runfiles.check_run_dir(i.run_dir)   # deleted under the run: RunDirGone
            rc = proc.poll()
            # new output (read once more after the process exited: its last lines)
            lines, offset = read_lines(log_path, offset, final=rc is not None)
            now = time.monotonic()
            for ln in lines:
                self._act(n, proc, log_path, out, dog.feed(ln.text, now, time.time()),
                          exited=rc is not None)
            if rc is None and (dog.reached_train or early):
                sb.on_train(n)     # the next attempt's interpreter (once)
            sb.poll()
            # the standby's imports slow this attempt: not its healthy baseline, not a collapse
            dog.monitor.paused = sb.importing()
            if rc is not None:
                out.exit_code = rc if rc >= 0 else None
                out.signal = -rc if rc < 0 else None
                break
            now = time.monotonic()
            if now >= next_sample:
                next_sample = now + SAMPLE_S
                self._sample(proc.pid, out, dog, now)
                if out.low_pending is not None and settled(out.host, out.low_pending[1]):
                    self._judge_low(n, proc.pid, out)
            acts: list[wd.Action] = []
            i.tick(n, proc, out, dog, now)
            if i.stop.reason and not out.stopped:
                out.stopped = True
                i.record.stopping(n, i.stop.reason)
                acts += dog.stop(now)
            self._act(n, proc, log_path, out, acts + dog.tick(now), exited=False)
            time.sleep(poll)
        if out.low_pending is not None:      # the attempt ended first: judge what was seen
            self._judge_low(n, proc.pid, out)
        # the tree: nothing of this attempt may outlive it
        left = procs.processes_of_run(i.run_dir, exclude=sb.pids())
        if left:
            procs.signal_all(left, signal.SIGKILL)
            procs.wait_gone(left, 5)
        i.after(n, out, dog)
        end = time.monotonic()
        out.hang, out.collapse, out.reached_train = dog.hang, dog.collapse, dog.reached_train
        out.frozen = dog.frozen
        out.duration_s = end - t0
        out.healthy_s = dog.healthy_s(end)
        return out

    def _sample(self, pid: int, out: Outcome, dog: wd.AttemptWatchdog, now: float) -> None:
        """The tree's CPU/I-O for the hang check; the host's load for a throughput drop."""
        tree = procs.descendants(pid) or [pid]
        out.pids_seen.update(tree)
        out.pids_seen.add(pid)
        cpu, io = out.meter.sample(tree)
        dog.activity(now, cpu, io, stopped=procs.stopped(tree))
        out.host.append(hostprobe.host_sample(now, cpu))
        while len(out.host) > 2 and out.host[1].t <= now - HOST_WINDOW_S:
            del out.host[0]

    def _throughput_low(self, pid: int, out: Outcome, reason: str) -> None:
        """tokens/s collapsed without dense-attention evidence: sample the host at the drop
        and go on sampling; :meth:`_judge_low` says what it showed once the samples cover
        the seconds after it (the drop shows before the host's counters do)."""
        if out.low_pending is not None:
            return
        now = time.monotonic()
        cpu, _ = out.meter.sample(procs.descendants(pid) or [pid])
        out.host.append(hostprobe.host_sample(now, cpu))
        out.low_pending = (reason, now, time.time())

    def _judge_low(self, n: int, pid: int, out: Outcome) -> None:
        """Record what the host showed around the drop (supervisor.policy.host_load.judge_drop); no
        restart and no config change (a busy host is not dense attention)."""
        assert out.low_pending is not None
        reason, t_drop, since = out.low_pending
        out.low_pending = None
        found = judge_drop(out.host, t_drop, gpu_apps=hostprobe.gpu_apps(),
                           our_pids=set(procs.descendants(pid)) | {pid})
        self.i.record.throughput_low(n, reason, since=since, cause=found.cause,
                                     summary=found.summary, causes=list(found.causes),
                                     seen=dict(found.seen))

    def _act(self, n: int, proc: subprocess.Popen, log_path: str, out: Outcome,
             actions: list[wd.Action], *, exited: bool) -> None:
        """Execute the watchdog's actions; signals only while the process has not exited
        (its pid may be reused once it is reaped)."""
        rec = self.i.record
        for a in actions:
            if isinstance(a, wd.StepProgress):
                rec.progress(a.step, a.tokens_per_s, a.baseline)
            elif isinstance(a, CheckpointMarker):
                rec.checkpointed(n, a.step, a.path)
            elif isinstance(a, EvalMarker):
                rec.evaluated(n, a.step, a.accept_len, a.best_accept_len)
            elif isinstance(a, wd.Warn):
                rec.emit(events.Watchdog(attempt=n, reason=a.reason))
            elif isinstance(a, wd.ThroughputDrop):
                self._throughput_low(proc.pid, out, a.reason)
            elif isinstance(a, wd.ThroughputBack):
                if out.low_pending is not None:   # recovered before the window was full
                    self._judge_low(n, proc.pid, out)
                rec.throughput_ok(n, a.reason)
            elif exited:
                continue
            elif isinstance(a, wd.Terminate):
                procs.signal_all([proc.pid], signal.SIGTERM)
            elif isinstance(a, wd.DumpStacks):
                out.stacks = dump_stacks(self.i.run_dir, n, proc.pid, log_path, self.i.python)
                rec.emit(events.Stacks(attempt=n, files=out.stacks))
            elif isinstance(a, wd.Kill):
                procs.kill_tree(proc.pid, self.i.run_dir, sig=signal.SIGKILL,
                                exclude=self.i.standby.pids())
