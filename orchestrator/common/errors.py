"""One error hierarchy for dfo.

Every error a user can cause is a ``DfoError`` whose ``str()`` is one line naming
what is wrong and how to fix it. Low-level exceptions (paramiko, socket, OSError,
yaml) are translated into these at the boundary where they happen. The CLI turns
them into exit codes in exactly one place (``orchestrator.cli``), with no traceback.

Exit codes (documented in docs/cli.md):

====  ======================  ==============================================
code  class                   meaning
====  ======================  ==============================================
0     -                       success
1     DfoError                unexpected dfo error (a bug: please report)
2     ConfigError             bad hosts.yaml, profile, run config or CLI input
3     ConnectError            host unreachable, auth failed, pct missing
4     HostKeyError            unknown or changed SSH host key
5     ContainerError          container not running / missing
6     RemoteCommandError      a remote command failed
7     DeployError             deploy failed / env not deployed / drift found / a record
                              of a newer dfo's format (ContractMismatch)
8     CacheError              compile-cache snapshot refused or missing
9     LockHeldError           another deploy or run holds the lock
10    RunFailed               the supervised run ended ``failed``
11    NotFoundError           a named checkpoint/run/snapshot does not exist
130   -                       interrupted (Ctrl-C)
====  ======================  ==============================================
"""

from __future__ import annotations

from dfo_contract.exitcodes import OneLineError


class DfoError(OneLineError):
    """Base of every error dfo raises on purpose (one line: what is wrong; how to fix it)."""

    exit_code = 1


class ConfigError(DfoError):
    exit_code = 2


class ConnectError(DfoError):
    exit_code = 3


class HostKeyError(ConnectError):
    exit_code = 4


class ContainerError(DfoError):
    exit_code = 5


class RemoteCommandError(DfoError):
    exit_code = 6

    def __init__(self, message: str, *, hint: str | None = None, exit_status: int | None = None,
                 stderr: str = ""):
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.stderr = stderr


class DeployError(DfoError):
    exit_code = 7


class VerifyError(DeployError):
    """The probe in a freshly built env did not match the profile."""


class DriftError(DeployError):
    """``dfo deploy --check`` found the env differs from its lock."""


class ContractMismatch(DeployError):
    """A run's record (``events.jsonl``, the follow wire) that this dfo cannot read
    faithfully: a newer format version, or a record that breaks its contract."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message, hint=hint or "use the dfo that deployed the host's env "
                         "here, or deploy this one there")


class CacheError(DfoError):
    exit_code = 8


class LockHeldError(DfoError):
    exit_code = 9


class RunFailed(DfoError):
    exit_code = 10


class NotFoundError(DfoError):
    exit_code = 11


EXIT_INTERRUPTED = 130


class Interrupted(DfoError):
    """Ctrl-C, saying what it left behind (a launch: whether a run started)."""

    exit_code = EXIT_INTERRUPTED
