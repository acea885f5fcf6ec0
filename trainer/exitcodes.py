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
====  ==========================================================================

The error classes subclass ``orchestrator.errors.DfoError`` so the orchestrator can catch
them when it imports torch-free trainer modules (``trainer.config``,
``trainer.ckpt_manifest``), but their ``exit_code`` is the trainer's table above.
"""

from __future__ import annotations

from orchestrator.errors import ConfigError as _OrchConfigError
from orchestrator.errors import DfoError

DONE = 0
CONFIG_ERROR = 2
DATA_ERROR = 3
CHECKPOINT_ERROR = 4
FATAL = 5
INTERRUPTED = 6

TABLE: dict[int, str] = {
    DONE: "done (max_steps reached)",
    CONFIG_ERROR: "config error",
    DATA_ERROR: "data error",
    CHECKPOINT_ERROR: "checkpoint error (resume target missing/corrupt)",
    FATAL: "fatal runtime error",
    INTERRUPTED: "interrupted by SIGTERM/SIGINT after saving a checkpoint",
}


class TrainerConfigError(_OrchConfigError):
    """A bad trainer config value; the message names the flag (``--train.micro_batch``)."""

    exit_code = CONFIG_ERROR


class DataError(DfoError):
    """Bad training data; the message names ``file:line``."""

    exit_code = DATA_ERROR


class CheckpointError(DfoError):
    """A resume target is missing, torn or corrupt."""

    exit_code = CHECKPOINT_ERROR


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf (exit 5; the supervisor's ``nan_loss`` class)."""


def exit_code_for(exc: BaseException) -> int:
    """The trainer exit code for an exception that ended the run."""
    if isinstance(exc, TrainerConfigError | _OrchConfigError):
        return CONFIG_ERROR
    if isinstance(exc, DataError):
        return DATA_ERROR
    if isinstance(exc, CheckpointError):
        return CHECKPOINT_ERROR
    return FATAL
