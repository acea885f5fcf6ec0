"""Why is throughput low? Pure judgement over samples of the host the supervisor took.

A throughput collapse without flex's dense-path evidence (its warning, recompile-limit
lines) is not a config problem: restarting with another config cannot fix a host that is
busy with something else. The supervisor samples ``/proc/stat``, ``/proc/loadavg`` and the
CPU time of its own attempt's process tree (and, when a collapse is seen, asks
``nvidia-smi --query-compute-apps``), and this module says what the samples show:

- ``host_busy``: the hypervisor steals CPU time (``steal`` in /proc/stat), or processes
  outside the run keep the host's cores busy, or the 1-minute load exceeds the cores;
- ``gpu_shared``: processes that are not this run's hold a compute context on the GPUs;
- ``unknown``: none of these (nothing to blame on the host: recorded, not acted on).

No I/O: the parsers take the files' text, :func:`judge` takes two samples and
:func:`judge_drop` the samples around a drop.

**When a drop is judged.** tokens/s falls the moment the host gets busy, the host's counters
(CPU time per window, the load average) show it only as the cause goes on: ten CPU hogs
that are still starting keep under one core busy for the first seconds. So a drop is not
judged when it is seen: the supervisor keeps sampling for ``AFTER_S`` seconds
(:func:`settled`) and then judges the sustained window after the drop, and, when that one
shows nothing, the ``BEFORE_S`` seconds before it (a cause that ended as the drop was seen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...common.gpu_apps import GpuApp

#: the hypervisor stole at least this fraction of all CPU time in the window
STEAL_FRACTION = 0.05
#: processes outside the run kept at least this many cores busy (or a quarter of them)
OTHERS_CORES = 1.0
#: a drop is judged over this many seconds of samples after it ...
AFTER_S = 5.0
#: ... or, when those show nothing, over this many seconds before it
BEFORE_S = 5.0


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat, in clock ticks."""

    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0

    @property
    def total(self) -> int:
        return (self.user + self.nice + self.system + self.idle + self.iowait + self.irq
                + self.softirq + self.steal)

    @property
    def idle_all(self) -> int:
        return self.idle + self.iowait


def parse_proc_stat(text: str) -> tuple[CpuTimes, int]:
    """(the aggregate ``cpu`` line, the number of ``cpuN`` lines) of /proc/stat's text."""
    agg = CpuTimes()
    ncpu = 0
    for ln in text.splitlines():
        parts = ln.split()
        if not parts:
            continue
        if parts[0] == "cpu":
            nums = [int(x) for x in parts[1:9] if x.isdigit()]
            nums += [0] * (8 - len(nums))
            agg = CpuTimes(*nums[:8])
        elif parts[0].startswith("cpu") and parts[0][3:].isdigit():
            ncpu += 1
    return agg, ncpu


def parse_loadavg(text: str) -> float | None:
    """The 1-minute load average of /proc/loadavg's text (None when unreadable)."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class HostSample:
    """One look at the host: ``t`` monotonic seconds, ``cpu`` /proc/stat's aggregate,
    ``ncpu`` cores, ``load1``, ``tree_cpu_s`` CPU seconds used so far by the attempt's tree."""

    t: float
    cpu: CpuTimes
    ncpu: int
    load1: float | None
    tree_cpu_s: float


@dataclass(frozen=True)
class Finding:
    cause: str                                  # "host_busy" | "gpu_shared" | "unknown"
    causes: tuple[str, ...] = ()                # every cause with evidence
    seen: dict = field(default_factory=dict)    # the numbers, for events and state.json
    summary: str = ""

    def to_json(self) -> dict:
        return {"cause": self.cause, "causes": list(self.causes), "seen": dict(self.seen),
                "summary": self.summary}


def judge(old: HostSample | None, new: HostSample | None, *,
          gpu_apps: Sequence[GpuApp] | None = None, our_pids: Iterable[int] = ()) -> Finding:
    """What the window between two samples shows. ``gpu_apps`` None: nvidia-smi was not
    available (unknown, not an error); ``our_pids``: the attempt's process tree."""
    seen: dict = {}
    causes: list[str] = []
    why: list[str] = []
    if old is not None and new is not None and new.t > old.t:
        dt = new.t - old.t
        ticks = new.cpu.total - old.cpu.total
        ncpu = max(1, new.ncpu)
        if ticks > 0:
            steal = (new.cpu.steal - old.cpu.steal) / ticks
            busy_cores = (ticks - (new.cpu.idle_all - old.cpu.idle_all)) / ticks * ncpu
            run_cores = max(0.0, (new.tree_cpu_s - old.tree_cpu_s) / dt)
            other_cores = max(0.0, busy_cores - run_cores)
            seen.update({"window_s": round(dt, 1), "cores": ncpu,
                         "steal_fraction": round(steal, 3), "busy_cores": round(busy_cores, 2),
                         "run_cores": round(run_cores, 2), "other_cores": round(other_cores, 2)})
            if steal >= STEAL_FRACTION:
                causes.append("host_busy")
                why.append(f"the hypervisor stole {steal:.0%} of the CPU time")
            if other_cores >= max(OTHERS_CORES, 0.25 * ncpu):
                if "host_busy" not in causes:
                    causes.append("host_busy")
                why.append(f"other processes kept {other_cores:.1f} of {ncpu} cores busy")
        if new.load1 is not None:
            seen["load1"] = new.load1
            if new.load1 > ncpu and "host_busy" not in causes:
                causes.append("host_busy")
                why.append(f"load {new.load1:.1f} > {ncpu} cores")
            elif new.load1 > ncpu:
                why.append(f"load {new.load1:.1f} > {ncpu} cores")
    if gpu_apps is None:
        seen["gpu_apps"] = "unknown (no nvidia-smi)"
    else:
        ours = set(our_pids)
        apps = [a for a in gpu_apps if a.pid is not None]
        mine = [a for a in apps if a.pid in ours]
        others = [a for a in apps if a.pid not in ours]
        seen["gpu_apps"] = [{"pid": a.pid, "name": a.name, "used_mib": a.used_mib,
                             "ours": a.pid in ours} for a in apps]
        # in a container nvidia-smi may show host pids: none of ours match then, and only
        # more than one app is evidence that someone else is there
        if others and (mine or len(others) > 1):
            causes.insert(0, "gpu_shared")
            why.insert(0, f"{len(others)} other process(es) on the GPUs: "
                          + ", ".join(f"{a.pid} {a.name}" for a in others[:4]))
    cause = causes[0] if causes else "unknown"
    summary = "; ".join(why) if why else "nothing on the host explains it"
    return Finding(cause, tuple(causes), seen, summary)


# --- the windows around a drop -------------------------------------------------------------

def _at_or_before(samples: Sequence[HostSample], t: float) -> HostSample | None:
    best = None
    for s in samples:
        if s.t <= t:
            best = s
    return best


def window_before(samples: Sequence[HostSample], drop_t: float, span: float = BEFORE_S
                  ) -> tuple[HostSample | None, HostSample | None]:
    """(old, new) for the ``span`` seconds up to the drop: the last sample at or before
    ``drop_t - span`` (else the earliest) and the last one at or before ``drop_t``."""
    if not samples:
        return None, None
    old = _at_or_before(samples, drop_t - span) or min(samples, key=lambda s: s.t)
    return old, _at_or_before(samples, drop_t)


def window_after(samples: Sequence[HostSample], drop_t: float, span: float = AFTER_S
                 ) -> tuple[HostSample | None, HostSample | None]:
    """(old, new) for the sustained window after the drop: the last sample at or before
    ``drop_t``, and the first one at or after ``drop_t + span`` (the latest when none is
    yet: the window was cut short, the attempt ended or tokens/s recovered)."""
    if not samples:
        return None, None
    old = _at_or_before(samples, drop_t)
    later = [s for s in samples if s.t >= drop_t + span]
    new = min(later, key=lambda s: s.t) if later else max(samples, key=lambda s: s.t)
    return old, new


def settled(samples: Sequence[HostSample], drop_t: float, span: float = AFTER_S) -> bool:
    """The samples cover ``span`` seconds after the drop: it can be judged."""
    return any(s.t >= drop_t + span for s in samples)


def judge_drop(samples: Sequence[HostSample], drop_t: float, *,
               gpu_apps: Sequence[GpuApp] | None = None, our_pids: Iterable[int] = (),
               before_s: float = BEFORE_S, after_s: float = AFTER_S) -> Finding:
    """Why tokens/s dropped at ``drop_t``: the sustained window after it when it shows a
    cause, else the window before it when that one does, else ``unknown`` with the
    sustained window's numbers. ``seen["window"]`` says which window was used."""
    pids = set(our_pids)
    after = judge(*window_after(samples, drop_t, after_s), gpu_apps=gpu_apps, our_pids=pids)
    found, which = after, "after"
    if after.cause == "unknown":
        before = judge(*window_before(samples, drop_t, before_s), gpu_apps=gpu_apps,
                       our_pids=pids)
        if before.cause != "unknown":
            found, which = before, "before"
    return Finding(found.cause, found.causes, {**found.seen, "window": which}, found.summary)
