"""The ``local`` transport: this machine, through subprocess (argv, never a shell)."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from dfo_contract.fsio import atomic_write_bytes

from ..common.errors import NotFoundError, RemoteCommandError
from .command import check_argv, check_env
from .base import LineCallback, Result, Transport, put_source

log = logging.getLogger("dfo")


class CommandTimeout(RemoteCommandError):
    """A command ran past its ``timeout`` and was killed (exit_status None)."""


#: where a command given no cwd runs (an SSH session starts in the user's home; "/" holds no
#: Python package a `python -m` could take for the deployed one)
NEUTRAL_CWD = "/"


def timeout_error(name: str, argv: Sequence[str], timeout: float) -> CommandTimeout:
    return CommandTimeout(f"{argv[0]} on {name} timed out after {timeout:g}s and was stopped",
                          hint="raise the timeout or check why it hangs")


class LineSplitter:
    """Feed bytes, get complete lines (newline and a trailing CR stripped)."""

    def __init__(self, on_line: LineCallback):
        self.on_line = on_line
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                return
            line, self.buf = self.buf[:i], self.buf[i + 1:]
            self.on_line(line.rstrip(b"\r").decode("utf-8", "replace"))

    def flush(self) -> None:
        if self.buf:
            line, self.buf = self.buf, b""
            self.on_line(line.rstrip(b"\r").decode("utf-8", "replace"))


class LocalTransport(Transport):
    kind = "local"
    is_local = True

    def __init__(self, name: str = "local"):
        super().__init__(name)

    # --- commands -------------------------------------------------------
    def _popen(self, argv, env, cwd, *, stdin, stdout, stderr):
        argv = check_argv(argv)
        full_env = None
        if env:
            full_env = dict(os.environ)
            full_env.update(check_env(env))
        try:
            # no cwd: a neutral directory, not the caller's, so that `python -m pkg` loads the
            # deployed env's modules, never a checkout's the caller happens to stand in
            return subprocess.Popen(argv, env=full_env, cwd=NEUTRAL_CWD if cwd is None else cwd,
                                    stdin=stdin, stdout=stdout,
                                    stderr=stderr, start_new_session=True)
        except FileNotFoundError as e:
            # the same answers env gives remotely: 125 bad cwd, 127 no such command
            if cwd is not None and not os.path.isdir(cwd):
                return _Failed(argv, 125, f"env: cannot change directory to '{cwd}': No such file or directory\n")
            return _Failed(argv, 127, f"env: '{argv[0]}': {e.strerror}\n")
        except NotADirectoryError:
            return _Failed(argv, 125, f"env: cannot change directory to '{cwd}': Not a directory\n")
        except PermissionError as e:
            return _Failed(argv, 126, f"env: '{argv[0]}': {e.strerror}\n")

    def run(self, argv, *, env=None, cwd=None, timeout=None, stdin=None, check=False) -> Result:
        p = self._popen(argv, env, cwd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if isinstance(p, _Failed):
            res = p.result()
        else:
            try:
                out, err = p.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(p)
                raise timeout_error(self.name, argv, timeout) from None
            except BaseException:  # Ctrl-C: the child leads its own session, stop it too
                _kill(p)
                raise
            res = Result(tuple(argv), p.returncode, out, err)
        return res.check() if check else res

    def stream(self, argv, on_line, *, env=None, cwd=None, timeout=None) -> Result:
        p = self._popen(argv, env, cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT)
        if isinstance(p, _Failed):
            for line in p.stderr.splitlines():
                on_line(line)
            return Result(tuple(argv), p.code)
        deadline = None if timeout is None else time.monotonic() + timeout
        splitter = LineSplitter(on_line)
        fd = p.stdout.fileno()
        os.set_blocking(fd, False)
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    _kill(p)
                    raise timeout_error(self.name, argv, timeout)
                if not sel.select(wait):
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    break
                splitter.feed(data)
            splitter.flush()
        except BaseException:
            _kill(p)
            raise
        finally:
            sel.close()
            p.stdout.close()
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            code = p.wait(wait)
        except subprocess.TimeoutExpired:
            _kill(p)
            raise timeout_error(self.name, argv, timeout) from None
        return Result(tuple(argv), code)

    # --- files ----------------------------------------------------------
    def put(self, data: bytes | Path, remote_path: str, *, mode: int | None = None) -> None:
        data, mode = put_source(data, mode)
        dest = Path(remote_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        atomic_write_bytes(dest, data, mode=mode & 0o7777)

    def get(self, remote_path: str) -> bytes:
        try:
            return Path(remote_path).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{remote_path} does not exist on {self.name}") from None
        except IsADirectoryError:
            raise RemoteCommandError(f"cannot read {remote_path} on {self.name}: it is a directory") from None
        except PermissionError:
            raise RemoteCommandError(f"cannot read {remote_path} on {self.name}: permission denied") from None


class _Failed:
    """A command that could not start; reported like env reports it on a remote side."""

    def __init__(self, argv, code: int, stderr: str):
        self.argv = tuple(argv)
        self.code = code
        self.stderr = stderr

    def result(self) -> Result:
        return Result(self.argv, self.code, b"", self.stderr.encode())


def _kill(p: subprocess.Popen) -> None:
    """Stop a command and everything it started (it leads its own session)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        log.warning("process %d did not exit after SIGKILL", p.pid)
