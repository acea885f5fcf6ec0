"""The failure classifier: a pure table of rules, shared by the supervisor and ``dfo diagnose``.

Input: an attempt's output lines plus what the supervisor knows about how the attempt
ended (exit code, the signal that killed it, whether the watchdog killed it for a hang,
whether the kernel's OOM killer fired, whether throughput collapsed). Output: one
:class:`Diagnosis` with a class name from :data:`classify_rules.CLASSES` and the evidence lines
(``dfo_contract.state_records.EvidenceLine``).

Rules are regexes tried on each line (``@dfo`` step markers are read as JSON for the
NaN-loss rule). When lines match several classes the most specific wins, in the
order of :data:`classify_rules.PRIORITY`: an FX race is what makes flex fall back to dense, so the race
is the cause and the dense warning the symptom.
"""

from __future__ import annotations

import math
import re
import signal as _signal
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from dfo_contract import exitcodes
from dfo_contract.markers import PREFIX as MARKER
from dfo_contract.state_records import EvidenceLine
from dfo_contract.trainer_markers import StepMarker, TrainerMarker, read_marker

from .classify_rules import (EXIT_DONE, EXIT_INTERRUPTED, PERMANENT_CLASSES, PERMANENT_EXITS,
                             PRIORITY, RULES, WEAK_RULES, Rule)

_SIGNAMES = {s.value: s.name for s in _signal.Signals}


@dataclass(frozen=True)
class Diagnosis:
    cls: str
    reason: str
    evidence: tuple[EvidenceLine, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    #: restarting cannot help (config/data/checkpoint error)
    permanent: bool = False
    #: every class that had evidence, for the curious
    also: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"class": self.cls, "reason": self.reason, "exit_code": self.exit_code,
                "signal": self.signal, "permanent": self.permanent, "also": list(self.also),
                "evidence": [e.to_json() for e in self.evidence]}


#: a traceback's first line; torchrun prefixes each line of a rank with ``[rankN]:``
_TB_START = re.compile(r"Traceback \(most recent call last\):")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
#: the exception line that ends a traceback: ``pkg.mod.SomeError: message`` (or the bare name)
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|"
                       r"Failed|Warning|Fault|Timeout)\b(?::.*)?$")


@dataclass
class LineScan:
    """Incremental scan state, so the supervisor can feed lines as they arrive."""

    hits: dict[str, list[EvidenceLine]] = field(default_factory=dict)
    n: int = 0
    max_per_class: int = 8
    #: the exception line of the last complete traceback, and the non-blank output lines
    #: (markers aside) printed after it
    exc: EvidenceLine | None = None
    after_exc: int = 0
    _in_tb: bool = False

    def feed(self, line: str, *, marker: TrainerMarker | None = None) -> Rule | None:
        """Scan one line (``marker``: the line's marker, when the caller parsed it already);
        return the first rule it matched (or None)."""
        self.n += 1
        text = line.rstrip("\r\n")
        rule = match_line(text, marker=marker)
        if rule is not None:
            lst = self.hits.setdefault(rule.cls, [])
            if len(lst) < self.max_per_class:
                lst.append(EvidenceLine(line=self.n, text=_clip(text), rule=rule.name))
        self._traceback(text)
        return rule

    def _traceback(self, text: str) -> None:
        if not text.strip() or text.startswith(MARKER):
            return
        body = _RANK_PREFIX.sub("", text)
        if _TB_START.search(body) or _FRAME.match(body):   # a SyntaxError has no header
            self._in_tb = True
            return
        if self._in_tb and not body[:1].isspace() and _EXC_LINE.match(body):
            self.exc = EvidenceLine(line=self.n, text=_clip(text), rule="traceback")
            self.after_exc, self._in_tb = 0, False
            return
        if self.exc is not None and not self._in_tb:
            self.after_exc += 1

    def ends_in_traceback(self) -> bool:
        """The output ends in a traceback: its exception line is among the last lines (a few
        lines of shutdown chatter after it allowed)."""
        return self.exc is not None and self.after_exc <= 3


def _clip(text: str, n: int = 400) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def match_line(text: str, *, marker: TrainerMarker | None = None) -> Rule | None:
    """The first rule matching one line of output (``marker``: the line's parsed marker, if
    the caller has it), or None."""
    if text.startswith(MARKER):
        m = marker if marker is not None else read_marker(text)
        return _NAN_MARKER if isinstance(m, StepMarker) and m.loss_is_nan else None
    for rule in RULES:
        if rule.pattern.search(text):
            return rule
    return None


_NAN_MARKER = Rule("nan_loss", "nan-loss-marker", re.compile(r"$^"), True)


def classify(lines: Iterable[str] | LineScan, *, exit_code: int | None = None,
             signal: int | None = None, hang: str | None = None, oom_killed: bool = False,
             collapse: str | None = None, done_marker: bool | None = None,
             frozen: str | None = None, oom_reason: str | None = None,
             own: bool = False) -> Diagnosis:
    """Classify one attempt.

    ``exit_code``: the trainer's exit status (None when it was killed by a signal or is
    unknown, e.g. an offline log). ``signal``: the signal that ended it. ``hang``: the
    watchdog's reason when the supervisor killed it for making no progress.
    ``oom_killed``: the kernel's OOM killer ended the attempt (a cgroup v1/v2 counter rose,
    or the kernel's log names one of its pids: ``supervisor.policy.oom``); ``oom_reason`` says which.
    ``collapse``: the throughput monitor's reason when tokens/s collapsed. A collapse alone
    is no class: a busy host slows training too (see ``supervisor.policy.host_load``); only with flex's
    dense-path lines is it ``dense_fallback``. ``frozen``: the watchdog's reason when a
    process of the attempt sat stopped (state T/t: SIGSTOP, a debugger), which is why it made
    no progress: ``frozen``, never ``compile_hang``. ``own``: your own command (``dfo
    launch -- CMD``), whose exit 0 says it finished, not that it reached a max_steps.
    """
    scan = lines if isinstance(lines, LineScan) else _scan_all(lines)
    hits = _strong(scan.hits)
    evidence_classes = [c for c in PRIORITY if c in hits]
    if oom_killed and "oom" not in evidence_classes:
        evidence_classes.insert(0, "oom")
    also = tuple(evidence_classes)
    sig_txt = f"signal {_SIGNAMES.get(signal, signal)}" if signal else None

    if exit_code == EXIT_DONE and not hang and not collapse and not frozen:
        return Diagnosis("done", "the command exited 0" if own else
                         "the trainer reached max_steps (exit 0)", (), exit_code, signal,
                         also=also)

    # the most specific evidence wins; a hang/collapse seen by the supervisor outranks
    # only what is less specific than itself
    def pick() -> tuple[str, str, tuple[EvidenceLine, ...]]:
        for c in PRIORITY:
            if c == "frozen" and frozen:
                return c, frozen, ()
            if c == "compile_hang" and hang:
                return c, f"no heartbeat or step: {hang}", tuple(hits.get(c, ()))
            if c == "oom" and oom_killed and c not in hits:
                return c, oom_reason or "killed by the kernel's OOM killer (cgroup oom_kill rose)", ()
            if c in hits:
                ev = tuple(hits[c])
                if c == "disk_full":   # the trainer's own line says it all
                    own = [e for e in ev if e.rule == "trainer-disk-full"]
                    return c, _reason_line(own[-1].text) if own else \
                        f"{ev[0].rule} in the output", ev
                return c, f"{ev[0].rule} in the output", ev
            if c == "disk_full" and exit_code == exitcodes.DISK_FULL:
                return c, "trainer exit 7: disk full", ()
        return "", "", ()

    cls, reason, ev = pick()
    if cls:
        if cls == "dense_fallback" and collapse and "dense_fallback" in hits:
            reason = f"{reason}; throughput collapse: {collapse}"
        elif cls in WHY:
            reason = f"{WHY[cls](ev[0].text) if ev else reason}"
        return Diagnosis(cls, reason, ev, exit_code, signal, permanent=cls in PERMANENT_CLASSES,
                         also=also)
    raised = scan.exc if scan.ends_in_traceback() else None

    who = "the command" if own else "the trainer"
    if exit_code in PERMANENT_EXITS and not own:   # the bundled trainer's codes (contracts.md)
        tail = _last_lines(scan, lines)
        return Diagnosis("crash", f"trainer {PERMANENT_EXITS[exit_code]} (exit {exit_code})",
                         tail, exit_code, signal, permanent=True, also=also)
    if exit_code is None and signal is None:
        if raised is not None:   # it raised: a crash, whatever its exit status was
            return Diagnosis("crash", f"the trainer raised {_exc_text(raised.text)}",
                             (raised,), None, None, also=also)
        return Diagnosis("crash", "the log shows no known failure pattern", (), None, None,
                         also=also)
    what = sig_txt or f"exit {exit_code}"
    if exit_code == EXIT_INTERRUPTED and not own:
        what = "exit 6 (interrupted by a signal the supervisor did not send)"
    if raised is not None and not signal:
        return Diagnosis("crash", f"{who} raised {_exc_text(raised.text)} ({what})",
                         _with(raised, _last_lines(scan, lines)), exit_code, signal, also=also)
    tail = _last_lines(scan, lines)
    said = f": {_exc_text(tail[-1].text)}" if own and tail and not signal else ""
    return Diagnosis("crash", f"{who} ended with {what}{said}", tail, exit_code, signal,
                     also=also)


def _exc_text(text: str, n: int = 200) -> str:
    body = _RANK_PREFIX.sub("", text)
    return body if len(body) <= n else body[: n - 1] + "…"


def _with(first: EvidenceLine, rest: tuple[EvidenceLine, ...]) -> tuple[EvidenceLine, ...]:
    return (first,) + tuple(e for e in rest if e.line != first.line)


_ERROFS_PATH = re.compile(r"Read-only file system: ['\"]?([^'\"]+)")


def _written_dir(path: str) -> str:
    """The directory a write was meant for: a checkpoint being written
    (``DIR/.step_N.tmp-PID/...``) is for ``DIR``; another path is itself."""
    from dfo_contract.checkpoints import ORPHAN_RE

    parts = path.rstrip("/").split("/")
    for i, part in enumerate(parts):
        if ORPHAN_RE.match(part):
            return "/".join(parts[:i]) or "/"
    return path


def _read_only_why(text: str) -> str:
    m = _ERROFS_PATH.search(text)
    where = f"{_written_dir(m.group(1))} is on a read-only filesystem" if m else \
        "a write hit a read-only filesystem"
    return (f"{where} (EROFS): no restart can write there; remount it read-write or set "
            "checkpoint.dir to a writable directory, then dfo launch --resume latest")


#: the reason of a class whose cure is known, from its first evidence line
WHY = {
    "compile_resources": lambda t: (
        "a compiled kernel needs more GPU shared memory than the device has (triton "
        f"OutOfResources: {_exc_text(t, 160)}); it fails the same way every time: compile "
        "with smaller flex kernel blocks or fewer stages"),
    "compile_workers": lambda t: (
        "inductor's compile worker pool broke (a worker process died: BrokenProcessPool); "
        "compile in the trainer's own process: TORCHINDUCTOR_COMPILE_THREADS=1"),
    "warmup_collective": lambda t: (
        "the ranks' first collective timed out before any completed (SeqNum=1): the ranks "
        "were out of step at warm-up, one still compiling while another waited in the first "
        "all-reduce; a retry meets the same skew: meet after the warm-up (or give the first "
        "collective a longer timeout)"),
    "read_only": _read_only_why,
    "compile_error": lambda t: f"the compile failed: {_exc_text(t, 200)}",
}


def _strong(hits: dict[str, list[EvidenceLine]]) -> dict[str, list[EvidenceLine]]:
    """The hits without a class whose evidence is only weak lines (WEAK_RULES), unless a
    compile failed (the weak lines then say why)."""
    out = {}
    for c, ev in hits.items():
        if all(e.rule in WEAK_RULES for e in ev) and "compile_error" not in hits:
            continue
        out[c] = ev
    return out


def _reason_line(text: str) -> str:
    """The trainer's error line without its ``trainer: `` prefix."""
    return text.split("trainer: ", 1)[-1] if text.startswith("trainer: ") else text


def _scan_all(lines: Iterable[str]) -> LineScan:
    scan = TailScan()
    for ln in lines:
        scan.feed(ln)
    return scan


@dataclass
class TailScan(LineScan):
    tail: list[tuple[int, str]] = field(default_factory=list)

    def feed(self, line: str, *, marker: TrainerMarker | None = None) -> Rule | None:
        r = super().feed(line, marker=marker)
        text = line.rstrip("\r\n")
        if text.strip() and not text.startswith(MARKER):
            self.tail.append((self.n, _clip(text)))
            if len(self.tail) > 5:
                del self.tail[0]
        return r


def _last_lines(scan: LineScan, _lines) -> tuple[EvidenceLine, ...]:
    tail = getattr(scan, "tail", None) or []
    return tuple(EvidenceLine(line=n, text=t, rule="last-output") for n, t in tail)


def classify_text(text: str, **kw) -> Diagnosis:
    return classify(text.splitlines(), **kw)


# --- throughput collapse ---------------------------------------------------------------

@dataclass
class ThroughputMonitor:
    """Detects tokens/s below ``fraction`` of this run's own healthy baseline for ``steps``
    consecutive step markers. The baseline is the median of the first ``baseline_steps``
    step markers after skipping ``skip_steps`` (the first steps after a compile are slow).
    """

    fraction: float = 0.5
    steps: int = 5
    baseline_steps: int = 5
    skip_steps: int = 2
    baseline: float | None = None
    #: the caller knows the host is busy with its own work (the standby interpreter's
    #: imports): no baseline sample is taken and no step counts as low meanwhile
    paused: bool = False
    _samples: list[float] = field(default_factory=list)
    _seen: int = 0
    _low: int = 0

    @property
    def low_steps(self) -> int:
        """Consecutive steps below the fraction so far (0 after a good step)."""
        return self._low

    def observe(self, tokens_per_s: float | None) -> str | None:
        """Feed one step's tokens/s; returns a reason string when collapse is detected."""
        if tokens_per_s is None or not isinstance(tokens_per_s, (int, float)) \
                or not math.isfinite(tokens_per_s) or tokens_per_s <= 0:
            return None
        self._seen += 1
        if self.paused:
            return None
        if self.baseline is None:
            if self._seen <= self.skip_steps:
                return None
            self._samples.append(float(tokens_per_s))
            if len(self._samples) >= self.baseline_steps:
                s = sorted(self._samples)
                self.baseline = s[len(s) // 2]
            return None
        if tokens_per_s < self.fraction * self.baseline:
            self._low += 1
            if self._low >= self.steps:
                return (f"{tokens_per_s:.0f} tok/s < {self.fraction:g} x baseline "
                        f"{self.baseline:.0f} tok/s for {self._low} steps")
        else:
            self._low = 0
        return None


def lines_from_file_text(text: str) -> Sequence[str]:
    """Split a saved log (any newline style) into lines."""
    return text.splitlines()
