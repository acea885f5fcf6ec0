"""The one small transport interface. The only layer with side effects.

Implementations: ``local`` (this machine), ``ssh`` (plain SSH into the box) and
``proxmox`` (SSH to the node, then ``pct exec VMID`` into the container).

Every command is an argv list. Implementations render it with ``shlex`` at each
nesting level (see ``orchestrator.transport.command``); nothing is ever built with an
f-string shell. ``env`` and ``cwd`` are applied with ``env [-C DIR] -- K=V argv``
on the far side, so no shell is needed for them either.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dfo_contract.fsio import atomic_write_bytes

from ..common.errors import DeployError, RemoteCommandError

#: the packages of dfo's own that run from the deployed env (``python -m PKG.module``)
DFO_PACKAGES = frozenset({"orchestrator", "trainer", "dfo_contract"})


def env_error(argv: Sequence[str], exit_code: int, err: str) -> DeployError | None:
    """A dfo module run with the deployed env's python (``.../envs/current/bin/python -m
    orchestrator...``) that could not start because the env is missing or lacks dfo (a
    killed ``deploy --force``): a DeployError saying to run ``dfo deploy``, else None.
    The one place every remote-module invocation's failure is translated."""
    if (len(argv) < 3 or argv[1] != "-m" or argv[2].split(".")[0] not in DFO_PACKAGES
            or not argv[0].endswith("/envs/current/bin/python") or exit_code == 0):
        return None
    env = argv[0][: -len("/bin/python")]
    if exit_code in (126, 127):
        return DeployError(f"no deployed env: {argv[0]} is missing",
                           hint="run `dfo deploy` first")
    missing = next((ln.strip() for ln in err.splitlines() if "No module named" in ln), None)
    if missing is None:
        return None
    what = missing[missing.index("No module named"):].rstrip(")")
    return DeployError(f"the deployed env {env} is incomplete ({what})",
                       hint="run `dfo deploy` to repair it")


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def check(self, what: str | None = None) -> "Result":
        """Raise RemoteCommandError (one line, with the last stderr line) unless exit 0."""
        if self.exit_code != 0:
            env = env_error(self.argv, self.exit_code, self.err)
            if env is not None:
                raise env
            last = next((ln for ln in reversed(self.err.strip().splitlines()) if ln.strip()), "")
            name = what or (self.argv[0] if self.argv else "command")
            msg = f"{name} exited {self.exit_code}"
            if last:
                msg += f": {last.strip()}"
            raise RemoteCommandError(msg, exit_status=self.exit_code, stderr=self.err)
        return self


LineCallback = Callable[[str], None]


def put_source(data: bytes | Path, mode: int | None) -> tuple[bytes, int | None]:
    """What ``put`` sends: the bytes, and the mode (a local file's own mode unless given)."""
    if isinstance(data, Path):
        if mode is None:
            mode = data.stat().st_mode & 0o7777
        data = data.read_bytes()
    return data, mode


class Transport(abc.ABC):
    """Run argvs and move files on one target (a host or a container)."""

    #: "local", "ssh" or "proxmox" (for messages; ask capabilities below, not the kind)
    kind: str = "?"
    #: True when commands run on this machine: local paths are the target's paths, and
    #: this machine's settings (uv's cache, PIP_FIND_LINKS) apply to it
    is_local: bool = False

    def __init__(self, name: str):
        self.name = name

    # --- commands -------------------------------------------------------
    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        check: bool = False,
    ) -> Result:
        """Run argv to completion; capture exit code, stdout and stderr."""

    @abc.abstractmethod
    def stream(
        self,
        argv: Sequence[str],
        on_line: LineCallback,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        """Run argv, calling ``on_line`` for each output line (stdout and stderr,
        newline stripped) as it arrives. The returned Result has empty stdout/stderr."""

    # --- files ----------------------------------------------------------
    @abc.abstractmethod
    def put(self, data: bytes | Path, remote_path: str, *, mode: int | None = None) -> None:
        """Write bytes (or a local file's contents) to remote_path atomically:
        a temporary name beside it, then rename. Keeps ``mode`` (or the local
        file's mode when ``data`` is a Path)."""

    @abc.abstractmethod
    def get(self, remote_path: str) -> bytes:
        """Read a remote file's bytes."""

    def get_file(self, remote_path: str, local_path: Path) -> None:
        """Copy a remote file to a local path (temporary name, then rename)."""
        atomic_write_bytes(local_path, self.get(remote_path))

    # --- target state ---------------------------------------------------
    def container_running(self) -> bool:
        """True when the target can run commands (always True but for proxmox)."""
        return True

    # --- lifecycle --------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - a transport that holds nothing open keeps this
        pass

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
