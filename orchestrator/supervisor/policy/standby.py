"""Pure decisions about the standby interpreter (docs/recovery.md, "Standby interpreter").

While attempt n trains, the supervisor keeps one pre-started Python process that has
already imported what the bundled trainer's next attempt needs; on restart it hands that
process the attempt instead of starting a fresh interpreter. This module decides when a
standby may be started and whether one may serve an attempt; it does no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from dfo_contract.codec import decode, encode
from dfo_contract.trainer_config import TrainerConfig

#: environment variables read at import time (by python, torch, triton, CUDA, the BLAS
#: libraries, transformers): the standby's start env and the attempt's must agree on them
IMPORT_ENV_PREFIXES = ("TORCH", "PYTORCH", "TORCHINDUCTOR", "CUDA", "NCCL", "TRITON", "PYTHON",
                       "LD_", "OMP_", "MKL_", "HF_", "TRANSFORMERS")
IMPORT_ENV_KEYS = frozenset({"PATH"})

#: the shim argv of a bundled-trainer attempt: [python, *SHIM_HEAD, flags...]
SHIM_HEAD = ("-m", "orchestrator.supervisor.shim", "trainer", "train")
#: layouts that run the trainer as one process (ddp runs under torchrun)
LAYOUTS = ("single", "threads")

#: how much lower the standby's priority is while it imports (os.nice increment)
NICE = 10
#: CAP_SYS_NICE's bit in /proc/self/status CapEff
CAP_SYS_NICE = 23
#: a standby still importing after this long is no longer taken to slow the attempt (an
#: import stuck on I/O uses no CPU; the throughput monitor must not stay paused for good)
IMPORT_PAUSE_MAX_S = 300.0


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The keys of ``env`` read at import time."""
    return {k: v for k, v in env.items()
            if k in IMPORT_ENV_KEYS or k.startswith(IMPORT_ENV_PREFIXES)}


def env_differences(start: Mapping[str, str], attempt: Mapping[str, str]) -> list[str]:
    """The import-time keys whose value differs (or that only one side has), sorted."""
    a, b = import_env(start), import_env(attempt)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def ineligible(argv: Sequence[str], *, own: bool, group: bool, layout: str | None) -> str | None:
    """Why an attempt with this argv cannot be served by a standby (None: it can)."""
    if own:
        return "your own trainer command (only the bundled trainer is preloaded)"
    if group:
        return "a multi-node run (torchrun)"
    if (layout or "single") not in LAYOUTS:
        return f"layout {layout} (only single and threads run in one process)"
    if len(argv) < 1 + len(SHIM_HEAD) or tuple(argv[1:1 + len(SHIM_HEAD)]) != SHIM_HEAD:
        return "not the bundled trainer's shim command"
    return None


@dataclass(frozen=True)
class Preload:
    """What the standby imports before it waits (trainer.preload)."""
    target_path: str | None = None
    compile: bool = True
    layout: str = "single"

    def to_json(self) -> dict:
        return encode(self)

    @staticmethod
    def from_json(d: object) -> "Preload":
        return decode(Preload, d, what="the standby's preload")


def preload_for(config: TrainerConfig) -> Preload:
    """The preload of the typed run config in force."""
    return Preload(target_path=config.model.target_path or None,
                   compile=config.compile.enabled or config.compile.target,
                   layout=config.parallel.layout)


def standby_argv(python: str, ready_fd: int, preload: Preload) -> list[str]:
    return [python, "-m", "orchestrator.supervisor.shim", "--standby", "--ready-fd",
            str(int(ready_fd)), "--preload", json.dumps(preload.to_json(), sort_keys=True)]


@dataclass
class StandbyProcess:
    """The supervisor's view of its standby (pid, what it was started with, readiness)."""
    pid: int
    python: str
    env: dict[str, str]
    started_at: float
    ready: bool = False
    alive: bool = True
    import_s: float | None = None
    env_dir: str | None = None      # the venv's bin dir, symlinks resolved, when it started


def importing(sb: StandbyProcess | None, now: float, max_s: float = IMPORT_PAUSE_MAX_S) -> bool:
    """Whether the standby is still importing and so competes with the attempt for CPU
    (``now``: wall seconds, like ``started_at``): the attempt's throughput meanwhile is
    neither its healthy baseline nor a collapse. On a 2-core host its imports slowed the
    trainer about tenfold."""
    return sb is not None and sb.alive and not sb.ready and now - sb.started_at < max_s


@dataclass(frozen=True)
class Use:
    use: bool
    reason: str


def start_with_attempt(cpus: int | None, early_cpus: float) -> bool:
    """Whether the next attempt's standby starts together with this attempt rather than once
    it reaches training. The FX error of the threaded lazy-compile race (docs/recovery.md)
    comes at the first step, before a standby started at training could finish importing;
    on a host with ``early_cpus`` CPUs or more (a GPU node) its imports run at nice +10
    beside the attempt's start. On a small host (CI's 2 cores) it waits for training.
    ``early_cpus`` 0: never early."""
    return early_cpus > 0 and (cpus or 0) >= early_cpus


def decide(sb: StandbyProcess | None, *, python: str, env: Mapping[str, str], argv: Sequence[str],
           why_not: str | None, env_dir: str | None = None) -> Use:
    """Whether the standby serves this attempt; the reason when it does not (None standby:
    reason "none"). A standby that died or is still importing is not waited for.
    ``env_dir``: the venv's bin dir as it resolves now; when ``dfo deploy`` replaced the env
    since the standby started, its modules are the old env's, so a fresh start must load
    the new one."""
    if sb is None:
        return Use(False, "none")
    if why_not is not None:
        return Use(False, f"not for this attempt: {why_not}")
    if not sb.alive:
        return Use(False, "it died")
    if not sb.ready:
        return Use(False, "not ready (still importing)")
    if argv and argv[0] != sb.python or python != sb.python:
        return Use(False, f"python differs ({sb.python} vs {argv[0] if argv else python})")
    if sb.env_dir is not None and env_dir is not None and env_dir != sb.env_dir:
        return Use(False, f"the env was replaced since it started ({sb.env_dir} -> {env_dir})")
    diff = env_differences(sb.env, env)
    if diff:
        return Use(False, "env differs: " + ", ".join(diff))
    return Use(True, "ready")


@dataclass(frozen=True)
class Request:
    """What the supervisor sends the standby (one JSON line on its stdin)."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str

    def to_line(self) -> bytes:
        return (json.dumps(encode(self)) + "\n").encode()

    @staticmethod
    def from_line(line: bytes) -> "Request":
        return decode(Request, json.loads(line.decode()), what="the standby's request")

    def module_argv(self) -> tuple[str, list[str]]:
        """The module the shim would run and its sys.argv (``[module, args...]``)."""
        if len(self.argv) < 4 or tuple(self.argv[1:3]) != SHIM_HEAD[:2]:
            raise ValueError("not a shim command")
        return self.argv[3], [self.argv[3], *self.argv[4:]]


@dataclass(frozen=True)
class Ready:
    """The standby's one line on its ready fd once its imports are done."""
    import_s: float
    modules: list[str] = field(default_factory=list)
    niced: bool = False
    error: str | None = None

    def to_line(self) -> bytes:
        return (json.dumps(encode(replace(self, import_s=round(self.import_s, 3)))) + "\n").encode()

    @staticmethod
    def from_line(line: bytes) -> "Ready":
        return decode(Ready, json.loads(line.decode()), what="the standby's ready line",
                      tolerant=True, import_s=0.0)


def can_restore_priority(*, euid: int, cap_eff: int, nice_now: int,
                         rlimit_nice_hard: int) -> bool:
    """Whether a process at ``nice_now`` may lower its nice value back to it after
    ``+NICE`` (root, CAP_SYS_NICE, or RLIMIT_NICE allows ``nice_now``: 20 - limit)."""
    if euid == 0 or cap_eff & (1 << CAP_SYS_NICE):
        return True
    if rlimit_nice_hard < 0:   # RLIM_INFINITY
        return True
    return nice_now >= 20 - rlimit_nice_hard
