"""The failure classifier: a pure table of rules, shared by the supervisor and ``dfo diagnose``.

Input: an attempt's output lines plus what the supervisor knows about how the attempt
ended (exit code, the signal that killed it, whether the watchdog killed it for a hang,
whether the kernel's OOM killer fired, whether throughput collapsed). Output: one
:class:`Diagnosis` with a class name from :data:`CLASSES` and the evidence lines.

Rules are regexes tried on each line (``@dfo`` step markers are read as JSON for the
NaN-loss rule). When lines match several classes the most specific wins, in the
order of :data:`PRIORITY`: an FX race is what makes flex fall back to dense, so the race
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
from dfo_contract.markers import parse_marker

CLASSES = ("fx_trace_race", "compile_hang", "dense_fallback", "oom", "nccl_timeout", "nan_loss",
           "frozen", "disk_full", "crash", "done")

#: when several classes have evidence, the first in this order wins
PRIORITY = ("disk_full", "fx_trace_race", "oom", "nccl_timeout", "nan_loss", "frozen",
            "compile_hang", "dense_fallback", "crash")

#: classes that no restart can help: the run stops at once and the reason says what to fix
PERMANENT_CLASSES = frozenset({"disk_full"})

#: classes only a multi-node run's node ends carry (``ops.group_decide``); not in CLASSES, so
#: no ladder or budget names them: ``node_lost`` gives up at once (the fix is in the reason),
#: ``peer_abort`` (this node stopped because another node's attempt failed) is never the
#: run's root cause while any node has a real class
PEER_ABORT = "peer_abort"
NODE_LOST = "node_lost"
GROUP_CLASSES = (PEER_ABORT, NODE_LOST)

#: trainer exit codes (dfo_contract.exitcodes) that mean "restarting cannot help"
PERMANENT_EXITS = {exitcodes.CONFIG_ERROR: "config error", exitcodes.DATA_ERROR: "data error",
                   exitcodes.CHECKPOINT_ERROR: "checkpoint error"}
EXIT_DONE = exitcodes.DONE
EXIT_INTERRUPTED = exitcodes.INTERRUPTED


@dataclass(frozen=True)
class Rule:
    cls: str
    name: str
    pattern: re.Pattern
    #: True: seeing this line while the attempt runs is enough to act on (kill + fallback)
    live: bool = True


def _r(cls: str, name: str, rx: str, *, live: bool = True) -> Rule:
    return Rule(cls, name, re.compile(rx), live)


RULES: tuple[Rule, ...] = (
    # the trainer's own line for a checkpoint that did not fit (trainer.train.diskfull): it
    # names the filesystem, what is free and what the checkpoint needs
    _r("disk_full", "trainer-disk-full", r"\bdisk full: the filesystem at ", live=False),
    # ENOSPC / EDQUOT anywhere else (a metrics file, a log, a compile cache); not acted on
    # while the attempt runs (a cache write that failed is a warning): its end decides
    _r("disk_full", "no-space-left", r"No space left on device|Disk quota exceeded",
       live=False),
    # torch/_dynamo/eval_frame.py compile_wrapper, in any thread's traceback
    _r("fx_trace_race", "fx-symbolic-trace-of-dynamo-fn",
       r"Detected that you are using FX to symbolically trace a dynamo-optimized function"),
    # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError / CUDA's own wording
    _r("oom", "torch-oom-error", r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b"),
    _r("oom", "cuda-out-of-memory", r"CUDA out of memory|CUDA error: out of memory"),
    # c10d ProcessGroupNCCL watchdog
    _r("nccl_timeout", "nccl-watchdog-timeout", r"Watchdog caught collective operation timeout"),
    _r("nccl_timeout", "nccl-watchdog-terminated",
       r"[Pp]rocess group watchdog thread terminated with exception"),
    _r("nccl_timeout", "collective-timeout",
       r"NCCL(?:Work|\b).{0,60}(?:timed out|Timeout\(ms\)=)|DistBackendError.*[Tt]imeout"),
    _r("nan_loss", "nan-loss-text",
       r"(?i)\b(?:non-finite|nan|inf) loss\b|\bloss(?: is|=|:)\s*(?:nan|-?inf)\b"),
    # torch/nn/attention/flex_attention.py: the unfused (dense) path
    _r("dense_fallback", "flex-dense-warning", r"materializes the full scores matrix"),
    # torch/_dynamo/convert_frame.py: recompile limit -> runs eager from then on
    _r("dense_fallback", "recompile-limit", r"hit config\.recompile_limit|recompile_limit \(\d+\)"),
)

_SIGNAMES = {s.value: s.name for s in _signal.Signals}


@dataclass(frozen=True)
class Evidence:
    line_no: int          # 1-based within the lines given
    text: str
    rule: str

    def to_json(self) -> dict:
        return {"line": self.line_no, "text": self.text, "rule": self.rule}


@dataclass(frozen=True)
class Diagnosis:
    cls: str
    reason: str
    evidence: tuple[Evidence, ...] = ()
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


@dataclass
class LineScan:
    """Incremental scan state, so the supervisor can feed lines as they arrive."""

    hits: dict[str, list[Evidence]] = field(default_factory=dict)
    n: int = 0
    max_per_class: int = 8

    def feed(self, line: str) -> Rule | None:
        """Scan one line; return the first rule it matched (or None)."""
        self.n += 1
        text = line.rstrip("\r\n")
        rule = match_line(text)
        if rule is not None:
            lst = self.hits.setdefault(rule.cls, [])
            if len(lst) < self.max_per_class:
                lst.append(Evidence(self.n, _clip(text), rule.name))
        return rule


def _clip(text: str, n: int = 400) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def match_line(text: str) -> Rule | None:
    """The first rule matching one line of output, or None."""
    if text.startswith(MARKER):
        return _match_marker(text)
    for rule in RULES:
        if rule.pattern.search(text):
            return rule
    return None


_NAN_MARKER = Rule("nan_loss", "nan-loss-marker", re.compile(r"$^"), True)


def _match_marker(text: str) -> Rule | None:
    rec = parse_marker(text)
    if rec and rec.get("kind") == "step":
        loss = rec.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            return _NAN_MARKER
    return None


def classify(lines: Iterable[str] | LineScan, *, exit_code: int | None = None,
             signal: int | None = None, hang: str | None = None, oom_killed: bool = False,
             collapse: str | None = None, done_marker: bool | None = None,
             frozen: str | None = None) -> Diagnosis:
    """Classify one attempt.

    ``exit_code``: the trainer's exit status (None when it was killed by a signal or is
    unknown, e.g. an offline log). ``signal``: the signal that ended it. ``hang``: the
    watchdog's reason when the supervisor killed it for making no progress.
    ``oom_killed``: the cgroup's oom_kill counter rose during the attempt.
    ``collapse``: the throughput monitor's reason when tokens/s collapsed. A collapse alone
    is no class: a busy host slows training too (see ``ops.host_load``); only with flex's
    dense-path lines is it ``dense_fallback``. ``frozen``: the watchdog's reason when a
    process of the attempt sat stopped (state T/t: SIGSTOP, a debugger), which is why it made
    no progress: ``frozen``, never ``compile_hang``.
    """
    scan = lines if isinstance(lines, LineScan) else _scan_all(lines)
    hits = scan.hits
    evidence_classes = [c for c in PRIORITY if c in hits]
    if oom_killed and "oom" not in evidence_classes:
        evidence_classes.insert(0, "oom")
    also = tuple(evidence_classes)
    sig_txt = f"signal {_SIGNAMES.get(signal, signal)}" if signal else None

    if exit_code == EXIT_DONE and not hang and not collapse and not frozen:
        return Diagnosis("done", "the trainer reached max_steps (exit 0)", (), exit_code, signal,
                         also=also)

    # the most specific evidence wins; a hang/collapse seen by the supervisor outranks
    # only what is less specific than itself
    def pick() -> tuple[str, str, tuple[Evidence, ...]]:
        for c in PRIORITY:
            if c == "frozen" and frozen:
                return c, frozen, ()
            if c == "compile_hang" and hang:
                return c, f"no heartbeat or step: {hang}", tuple(hits.get(c, ()))
            if c == "oom" and oom_killed and c not in hits:
                return c, "killed by the kernel's OOM killer (cgroup oom_kill rose)", ()
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
        return Diagnosis(cls, reason, ev, exit_code, signal, permanent=cls in PERMANENT_CLASSES,
                         also=also)

    if exit_code in PERMANENT_EXITS:
        tail = _last_lines(scan, lines)
        return Diagnosis("crash", f"trainer {PERMANENT_EXITS[exit_code]} (exit {exit_code})",
                         tail, exit_code, signal, permanent=True, also=also)
    if exit_code is None and signal is None:
        return Diagnosis("crash", "the log shows no known failure pattern", (), None, None,
                         also=also)
    what = sig_txt or f"exit {exit_code}"
    if exit_code == EXIT_INTERRUPTED:
        what = "exit 6 (interrupted by a signal the supervisor did not send)"
    return Diagnosis("crash", f"the trainer ended with {what}", _last_lines(scan, lines),
                     exit_code, signal, also=also)


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

    def feed(self, line: str) -> Rule | None:
        r = super().feed(line)
        text = line.rstrip("\r\n")
        if text.strip() and not text.startswith(MARKER):
            self.tail.append((self.n, _clip(text)))
            if len(self.tail) > 5:
                del self.tail[0]
        return r


def _last_lines(scan: LineScan, _lines) -> tuple[Evidence, ...]:
    tail = getattr(scan, "tail", None) or []
    return tuple(Evidence(n, t, "last-output") for n, t in tail)


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
