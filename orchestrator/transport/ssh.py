"""The ``ssh`` transport: paramiko, one connection per dfo invocation.

- One ``paramiko.SSHClient`` per transport, opened on first use and reused for every
  command and file transfer (each is one exec channel). Keepalive every 15 s.
- ProxyJump (``a,b``): each hop is a direct-tcpip channel of the previous hop's
  connection; every hop's host key is checked too.
- Host keys are checked against the host's ``known_hosts`` (else ``~/.ssh/known_hosts``).
  Unknown keys are refused with their fingerprint and ``dfo hosts trust NAME``;
  changed keys are refused loudly. Never ``AutoAddPolicy``.
- paramiko/socket exceptions become ``ConnectError``/``HostKeyError`` here, with the fix.
- A command is ``shlex``-joined once: the remote login shell splits it back into the argv
  and evaluates nothing (see ``orchestrator.transport.command``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import paramiko

from ..common.errors import ConnectError, NotFoundError, RemoteCommandError
from . import command as cmd
from .base import LineCallback, Result, Transport, put_source
from .local import LineSplitter, timeout_error
from .settings import SSHSettings
from .ssh_errors import RefuseUnknown, translate

log = logging.getLogger("dfo")
# paramiko logs connection failures with tracebacks from its own thread; dfo reports them as
# one-line ConnectErrors instead. Without a handler Python would print them to stderr
# (logging.lastResort), so give paramiko's logger a NullHandler (no output of its own).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_S = 15
_CHUNK = 1 << 16


# --------------------------------------------------------------------------- hops

def jump_hops(settings: SSHSettings) -> list[SSHSettings]:
    """The ProxyJump chain (resolved by ``orchestrator.config`` into ``settings.jumps``)."""
    return list(settings.jumps)


# --------------------------------------------------------------------------- connecting

def open_sock(s: SSHSettings, via: paramiko.SSHClient | None):
    """A socket to ``s``: direct, or a direct-tcpip channel of the previous hop."""
    if via is None:
        sock = socket.create_connection((s.host, s.port), timeout=s.connect_timeout)
        _tcp_keepalive(sock)
        return sock
    t = via.get_transport()
    return t.open_channel("direct-tcpip", (s.host, s.port), ("127.0.0.1", 0),
                          timeout=s.connect_timeout)


def _tcp_keepalive(sock: socket.socket) -> None:
    """Notice a dead peer in about 30 s (paramiko's keepalive wants no reply, so on its
    own a silently dropped link would hang until TCP gives up, many minutes later)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
    except OSError:  # pragma: no cover - not every platform has these
        pass


def connect_client(s: SSHSettings, name: str, via: paramiko.SSHClient | None = None, *,
                   trust_as: str | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    kh = s.known_hosts_path
    if os.path.exists(kh):
        try:
            client.load_system_host_keys(kh)
        except OSError as e:
            raise ConnectError(f"cannot read known_hosts file {kh}: {e.strerror}") from None
    client.set_missing_host_key_policy(RefuseUnknown(name, kh, trust_as))
    try:
        sock = open_sock(s, via)
        client.connect(
            s.host, port=s.port, username=s.user, key_filename=s.identity_file,
            timeout=s.connect_timeout, banner_timeout=s.connect_timeout,
            auth_timeout=s.connect_timeout, channel_timeout=s.connect_timeout,
            allow_agent=True, look_for_keys=s.identity_file is None, sock=sock,
        )
    except Exception as e:  # noqa: BLE001 - translated right here
        client.close()
        raise translate(e, name, s, trust_as) from None
    t = client.get_transport()
    t.set_keepalive(KEEPALIVE_S)
    return client


class Connection:
    """One SSH connection (plus its jump hosts), opened lazily and reopened when lost."""

    def __init__(self, name: str, settings: SSHSettings):
        self.name = name
        self.settings = settings
        self._clients: list[paramiko.SSHClient] = []
        self._lock = threading.Lock()
        self.connects = 0  # how many times a connection was opened (tests: exactly one)

    def transport(self) -> paramiko.Transport:
        with self._lock:
            if self._clients:
                t = self._clients[-1].get_transport()
                if t is not None and t.is_active():
                    return t
                log.info("connection to %s was lost; reconnecting", self.name)
                self._close()
            via = None
            for hop in jump_hops(self.settings):
                via = connect_client(hop, f"{self.name} (jump host {hop.host})", via,
                                     trust_as=self.name)
                self._clients.append(via)
            try:
                self._clients.append(connect_client(self.settings, self.name, via))
            except BaseException:
                self._close()
                raise
            self.connects += 1
            log.debug("connected to %s (%s)", self.name, self.settings.display())
            return self._clients[-1].get_transport()

    def _close(self) -> None:
        for c in reversed(self._clients):
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self._clients = []

    def close(self) -> None:
        with self._lock:
            self._close()


# --------------------------------------------------------------------------- exec

def _signal(chan: paramiko.Channel, sig: str = "KILL") -> None:
    """Best effort: ask sshd to signal the command (RFC 4254 "signal" request)."""
    try:
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string(sig)
        chan.transport._send_user_message(m)
    except Exception:  # noqa: BLE001 - best effort
        pass


class _Reader(threading.Thread):
    def __init__(self, recv: Callable[[int], bytes], sink: Callable[[bytes], None]):
        super().__init__(daemon=True)
        self.recv = recv
        self.sink = sink
        self.error: BaseException | None = None

    def run(self):
        try:
            while True:
                data = self.recv(_CHUNK)
                if not data:
                    return
                self.sink(data)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            self.error = e


def exec_channel(conn: Connection, command: str, *, argv: tuple[str, ...], stdin: bytes | None,
                 timeout: float | None, on_stdout: Callable[[bytes], None],
                 on_stderr: Callable[[bytes], None] | None) -> int:
    """Run one command string on an exec channel; returns its exit status.
    ``on_stderr`` None merges stderr into stdout."""
    t = conn.transport()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        chan = t.open_session(timeout=conn.settings.connect_timeout)
    except Exception as e:  # noqa: BLE001
        raise _lost(conn, e) from None
    try:
        if on_stderr is None:
            chan.set_combine_stderr(True)
        chan.exec_command(command)
        # a sink that raises ends the command at once and its error reaches the caller
        # (not a "connection lost"; nobody would read the rest of the output)
        sink_error: list[BaseException] = []

        def guard(sink: Callable[[bytes], None]) -> Callable[[bytes], None]:
            def feed(data: bytes) -> None:
                try:
                    sink(data)
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                    sink_error.append(e)
                    _signal(chan)
                    chan.close()
                    raise
            return feed

        readers = [_Reader(chan.recv, guard(on_stdout))]
        if on_stderr is not None:
            readers.append(_Reader(chan.recv_stderr, guard(on_stderr)))
        for r in readers:
            r.start()
        writer_error: list[BaseException] = []
        if stdin:
            def write():
                try:
                    view = memoryview(stdin)
                    while view:
                        n = chan.send(view[:_CHUNK])
                        if n <= 0:
                            break
                        view = view[n:]
                    chan.shutdown_write()
                except BaseException as e:  # noqa: BLE001
                    writer_error.append(e)
            w = threading.Thread(target=write, daemon=True)
            w.start()
        else:
            chan.shutdown_write()
            w = None
        for r in readers:
            r.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if timeout is not None and r.is_alive():  # alive after join only with a deadline
                _signal(chan)
                raise timeout_error(conn.name, argv, timeout)
        if sink_error:
            raise sink_error[0]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if timeout is not None and not chan.status_event.wait(remaining):
            _signal(chan)
            raise timeout_error(conn.name, argv, timeout)
        for r in readers:
            if r.error is not None:
                raise _lost(conn, r.error)
        if w is not None:
            w.join(5)
        status = chan.recv_exit_status()
        if status == -1 and not t.is_active():
            raise _lost(conn, EOFError("connection closed"))
        return status
    finally:
        chan.close()


def _lost(conn: Connection, e: BaseException) -> Exception:
    if isinstance(e, ConnectError):
        return e
    return ConnectError(f"connection to {conn.name} ({conn.settings.display()}) failed: "
                        f"{e or type(e).__name__}", hint="check the host and run the command again")


# --------------------------------------------------------------------------- timeouts

#: extra seconds the local side waits beyond ``timeout`` for the far side's own
#: ``timeout`` (TERM, then KILL after cmd.KILL_AFTER_S) before it gives up on the channel
_GRACE_S = cmd.KILL_AFTER_S + 10


def _local_deadline(timeout: float | None) -> float | None:
    return None if timeout is None else timeout + _GRACE_S


def _check_timed_out(name: str, argv, timeout: float | None, code: int, t0: float) -> None:
    """The far side's ``timeout`` exits 124 when it stopped the command; after KILL it dies
    with its process group (sshd reports a signal: -1; lxc-attach reports 137)."""
    if timeout is not None and code in (124, 137, -1) and time.monotonic() - t0 >= timeout * 0.95:
        raise timeout_error(name, argv, timeout)


# --------------------------------------------------------------------------- the transport

class SSHTransport(Transport):
    kind = "ssh"

    def __init__(self, name: str, settings: SSHSettings):
        super().__init__(name)
        self.settings = settings
        self.conn = Connection(name, settings)

    # How an argv becomes the string sent over ssh (proxmox wraps it in pct exec).
    def render(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
        return cmd.ssh_command(argv, env, cwd)

    def connect(self) -> None:
        """Open the connection now (otherwise it opens on first use)."""
        self.conn.transport()

    def _exec(self, argv, command: str, *, stdin, timeout, check) -> Result:
        out: list[bytes] = []
        err: list[bytes] = []
        t0 = time.monotonic()
        code = exec_channel(self.conn, command, argv=tuple(argv), stdin=stdin,
                            timeout=_local_deadline(timeout), on_stdout=out.append, on_stderr=err.append)
        _check_timed_out(self.name, argv, timeout, code, t0)
        res = Result(tuple(argv), code, b"".join(out), b"".join(err))
        return res.check() if check else res

    def run(self, argv, *, env=None, cwd=None, timeout=None, stdin=None, check=False) -> Result:
        argv = cmd.check_argv(argv)
        command = self.render(cmd.with_timeout(argv, timeout), env, cwd)
        return self._exec(argv, command, stdin=stdin, timeout=timeout, check=check)

    def stream(self, argv, on_line: LineCallback, *, env=None, cwd=None, timeout=None) -> Result:
        argv = cmd.check_argv(argv)
        # stdout and stderr arrive on separate streams (lxc-attach relays them apart): split
        # each into lines on its own, so a partial line of one never glues to the other;
        # one lock, so on_line is never called from two threads at once.
        lock = threading.Lock()

        def emit(line: str) -> None:
            with lock:
                on_line(line)

        out, err = LineSplitter(emit), LineSplitter(emit)
        t0 = time.monotonic()
        code = exec_channel(self.conn, self.render(cmd.with_timeout(argv, timeout), env, cwd),
                            argv=tuple(argv), stdin=None, timeout=_local_deadline(timeout),
                            on_stdout=out.feed, on_stderr=err.feed)
        out.flush()
        err.flush()
        _check_timed_out(self.name, argv, timeout, code, t0)
        return Result(tuple(argv), code)

    # --- files (through stdin of a constant sh script; works the same in a container) ----
    def put(self, data: bytes | Path, remote_path: str, *, mode: int | None = None) -> None:
        data, mode = put_source(data, mode)
        res = self.run(cmd.put_argv(remote_path, len(data), mode), stdin=data)
        if not res.ok:
            last = (res.err.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
            raise RemoteCommandError(f"cannot write {remote_path} on {self.name}: {last}",
                                     exit_status=res.exit_code, stderr=res.err)

    def get(self, remote_path: str) -> bytes:
        res = self.run(cmd.get_argv(remote_path))
        if res.ok:
            return res.stdout
        if "No such file" in res.err:
            raise NotFoundError(f"{remote_path} does not exist on {self.name}")
        last = (res.err.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise RemoteCommandError(f"cannot read {remote_path} on {self.name}: {last}",
                                 exit_status=res.exit_code, stderr=res.err)

    def close(self) -> None:
        self.conn.close()
