"""The trainer's exit codes and the errors that map onto them (torch-free).

====  ==========================================================================
code  meaning
====  ==========================================================================
0     done (``train.max_steps`` reached)
2     config error (bad YAML, unknown key, invalid value; the message names the flag)
3     data error (malformed line, token id >= vocab, missing field; names file:line)
4     checkpoint error (resume target missing, torn or corrupt)
5     fatal runtime error (any uncaught exception: OOM, the FX race, NaN loss, ...)
6     interrupted by SIGTERM/SIGINT after saving a checkpoint
7     disk full (a checkpoint did not fit; names the filesystem and the space it needs)
====  ==========================================================================

This table is the trainer's, not dfo's: dfo's own exit codes (``orchestrator.common.errors``)
are a separate table (dfo's 3 is a connect error, the trainer's 3 a data error). The
orchestrator translates a ``TrainerError`` it meets (validating a run config locally)
into its own ``ConfigError`` at that boundary.
"""

from __future__ import annotations


DONE = 0
CONFIG_ERROR = 2
DATA_ERROR = 3
CHECKPOINT_ERROR = 4
FATAL = 5
INTERRUPTED = 6
DISK_FULL = 7

TABLE: dict[int, str] = {
    DONE: "done (max_steps reached)",
    CONFIG_ERROR: "config error",
    DATA_ERROR: "data error",
    CHECKPOINT_ERROR: "checkpoint error (resume target missing/corrupt)",
    FATAL: "fatal runtime error",
    INTERRUPTED: "interrupted by SIGTERM/SIGINT after saving a checkpoint",
    DISK_FULL: "disk full (a checkpoint did not fit)",
}


class OneLineError(Exception):
    """An error raised on purpose: ``str()`` is one line, what is wrong and (``hint``) how to
    fix it. The base of the trainer's ``TrainerError`` and of dfo's ``DfoError``; each
    subclass carries its table's ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class TrainerError(OneLineError):
    """Base of the errors the trainer raises on purpose; ``str()`` is one line."""

    exit_code = FATAL


class TrainerConfigError(TrainerError):
    """A bad trainer config value; the message names the flag (``--train.micro_batch``)."""

    exit_code = CONFIG_ERROR


class DataError(TrainerError):
    """Bad training data; the message names ``file:line``."""

    exit_code = DATA_ERROR


class CheckpointError(TrainerError):
    """A resume target is missing, torn or corrupt."""

    exit_code = CHECKPOINT_ERROR


class DiskFullError(TrainerError):
    """The filesystem of the checkpoint directory is full (ENOSPC, or over quota): no
    restart can help until space is freed. The message starts ``disk full:`` and names the
    filesystem, what is free and what the checkpoint needs."""

    exit_code = DISK_FULL


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf (exit 5; the supervisor's ``nan_loss`` class)."""


def exit_code_for(exc: BaseException) -> int:
    """The trainer exit code for an exception that ended the run."""
    if isinstance(exc, TrainerError):
        return exc.exit_code
    return FATAL
