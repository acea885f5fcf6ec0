"""Watching one attempt: read its log by byte offset, feed the watchdog, sample the process
tree and the host, and execute the watchdog's actions (dump stacks, SIGTERM, kill, record a
throughput drop). Mixed into :class:`~orchestrator.supervisor.core.Supervisor`, which owns
the state, the events and the decisions between attempts."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from dataclasses import dataclass, field

from dfo_contract import events

from ..ops import watchdog as wd
from ..ops.byo import compile_step_pattern
from ..ops.classify import LineScan, TailScan
from ..ops.host_load import HostSample, judge_drop, settled
from . import group, hostprobe, procs
from .lines import read_lines
from .stacks import dump_stacks

#: how often the attempt's tree and the host are sampled, and how far back a throughput
#: drop is compared (the steps that collapsed took about this long)
SAMPLE_S = 1.0
HOST_WINDOW_S = 30.0


@dataclass
class Outcome:
    exit_code: int | None = None
    signal: int | None = None
    hang: str | None = None
    collapse: str | None = None
    stopped: bool = False
    reached_train: bool = False
    healthy_s: float = 0.0
    duration_s: float = 0.0
    oom_killed: bool = False
    scan: LineScan = field(default_factory=TailScan)
    stacks: list[str] = field(default_factory=list)
    #: the attempt's process tree (TreeMeter) and the host, sampled about once a second
    meter: hostprobe.TreeMeter = field(default_factory=hostprobe.TreeMeter)
    host: list[HostSample] = field(default_factory=list)
    #: a throughput drop whose host judgement waits for the samples after it
    #: (ops.host_load.settled): (reason, monotonic t, wall t)
    low_pending: tuple[str, float, float] | None = None
    #: a multi-node run (supervisor.group): another node's abort, the lost nodes
    #: [(index, silent s)], whether this node aborted first, when to SIGKILL
    peer_abort: str | None = None
    lost: list | None = None
    origin: bool = False
    abort_set: bool = False
    kill_at: float | None = None
    store_next: float = 0.0


class AttemptWatch:
    """The attempt-watching half of the supervisor (needs ``state``, ``t``, ``spec``,
    ``run_dir``, ``stop_reason``, ``emit``, ``save``, ``_config``)."""

    def _watch(self, n: int, proc: subprocess.Popen, log_path: str) -> Outcome:
        """Read the attempt's new lines, feed them to the watchdog, do what it says."""
        t0 = time.monotonic()
        base = self.state.baseline_tokens_per_s
        own = self.spec.own
        t = self.t
        if self.group is not None and not self.group.is_head:
            # the main rank (its markers) runs on the head: the head judges hangs; a peer
            # judges only its own process (exit, fatal lines, OOM)
            t = dataclasses.replace(t, warmup_s=1e12, train_s=1e12, hang_s=0.0)
        dog = wd.Watchdog(t, now=t0,
                          baseline=base if self.state.baseline_overrides == self.state.overrides
                          else None,
                          dense_expected=str(self._config().get("model.attention", ""))
                          == "flex-eager",   # uncompiled flex on purpose
                          step_pattern=compile_step_pattern(own.step_pattern if own else None),
                          cpu_is_progress=own is not None)
        out = Outcome(scan=dog.scan)
        poll = float(self.t.poll_s)
        offset = 0
        next_sample = t0
        early = self.standby.early()
        while True:
            rc = proc.poll()
            # new output (read once more after the process exited: its last lines)
            lines, offset = read_lines(log_path, offset, final=rc is not None)
            now = time.monotonic()
            for ln in lines:
                self._act(n, proc, log_path, out, dog.feed(ln.text, now), exited=rc is not None)
            if rc is None and (dog.reached_train or early):
                self.standby.on_train(n)     # the next attempt's interpreter (once)
            self.standby.poll()
            # the standby's imports slow this attempt: not its healthy baseline, not a collapse
            dog.monitor.paused = self.standby.importing()
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
            if self.coord is not None:
                group.tick(self, n, proc, out, dog, now)
            if self.stop_reason and not out.stopped:
                out.stopped = True
                self.state.status = "stopping"
                self.emit(events.Stopping(attempt=n, reason=self.stop_reason))
                self.save()
                acts += dog.stop(now)
            self._act(n, proc, log_path, out, acts + dog.tick(now), exited=False)
            time.sleep(poll)
        if out.low_pending is not None:      # the attempt ended first: judge what was seen
            self._judge_low(n, proc.pid, out)
        # the tree: nothing of this attempt may outlive it
        left = procs.processes_of_run(self.run_dir, exclude=self.standby.pids())
        if left:
            procs.signal_all(left, signal.SIGKILL)
            procs.wait_gone(left, 5)
        if self.coord is not None:
            group.after_watch(self, n, out)
        end = time.monotonic()
        out.hang, out.collapse, out.reached_train = dog.hang, dog.collapse, dog.reached_train
        out.duration_s = end - t0
        out.healthy_s = dog.healthy_s(end)
        return out

    def _sample(self, pid: int, out: Outcome, dog: wd.Watchdog, now: float) -> None:
        """The tree's CPU/I-O for the hang check; the host's load for a throughput drop."""
        cpu, io = out.meter.sample(procs.descendants(pid) or [pid])
        dog.activity(now, cpu, io)
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
        """Record what the host showed around the drop (ops.host_load.judge_drop); no
        restart and no config change (a busy host is not dense attention)."""
        assert out.low_pending is not None
        reason, t_drop, since = out.low_pending
        out.low_pending = None
        found = judge_drop(out.host, t_drop, gpu_apps=hostprobe.gpu_apps(),
                           our_pids=set(procs.descendants(pid)) | {pid})
        self.state.throughput_low = {"cause": found.cause, "summary": found.summary,
                                     "since": since, "attempt": n, "reason": reason}
        self.emit(events.ThroughputLow(attempt=n, reason=reason, cause=found.cause,
                                       causes=list(found.causes), seen=dict(found.seen),
                                       summary=found.summary))
        self.save()

    def _act(self, n: int, proc: subprocess.Popen, log_path: str, out: Outcome,
             actions: list[wd.Action], *, exited: bool) -> None:
        """Execute the watchdog's actions; signals only while the process has not exited
        (its pid may be reused once it is reaped)."""
        for a in actions:
            if isinstance(a, wd.Step):
                self.state.last_step, self.state.tokens_per_s = a.step, a.tokens_per_s
                if a.baseline and not self.state.baseline_tokens_per_s:
                    self.state.baseline_tokens_per_s = a.baseline
                    self.state.baseline_overrides = dict(self.state.overrides)
                self.save()
            elif isinstance(a, wd.Checkpoint):
                self.state.last_checkpoint = {"step": a.step, "path": a.path}
                self.emit(events.Checkpoint(attempt=n, step=a.step, path=a.path))
                self.save()
            elif isinstance(a, wd.Eval):
                self.state.accept_len, self.state.best_accept_len = a.accept_len, a.best_accept_len
                self.emit(events.Eval(attempt=n, step=a.step, accept_len=a.accept_len,
                                      best_accept_len=a.best_accept_len))
                self.save()
            elif isinstance(a, wd.Warn):
                self.emit(events.Watchdog(attempt=n, reason=a.reason))
            elif isinstance(a, wd.ThroughputLow):
                self._throughput_low(proc.pid, out, a.reason)
            elif isinstance(a, wd.ThroughputOk):
                if out.low_pending is not None:   # recovered before the window was full
                    self._judge_low(n, proc.pid, out)
                self.state.throughput_low = None
                self.emit(events.ThroughputOk(attempt=n, reason=a.reason))
                self.save()
            elif exited:
                continue
            elif isinstance(a, wd.Terminate):
                procs.signal_all([proc.pid], signal.SIGTERM)
            elif isinstance(a, wd.DumpStacks):
                out.stacks = dump_stacks(self.run_dir, n, proc.pid, log_path,
                                         self.spec.identity.python)
                self.emit(events.Stacks(attempt=n, files=out.stacks))
            elif isinstance(a, wd.Kill):
                procs.kill_tree(proc.pid, self.run_dir, sig=signal.SIGKILL,
                                exclude=self.standby.pids())
