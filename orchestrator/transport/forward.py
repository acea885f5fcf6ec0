"""Long-lived processes with a live stdin, and a local port forwarded to the target's loopback.

The rest of the transport runs commands to completion; ``dfo tensorboard`` needs two more
things, built on the same connection:

- ``open_pipe(t, argv)``: start argv on the target with stdin/stdout as byte streams
  (local: a subprocess; ssh/proxmox: one exec channel of the existing connection, the
  command rendered exactly as ``run`` renders it, through ``pct exec`` for proxmox).
  Closing it closes the far side's stdin: a process that watches its stdin can stop.
- ``LocalForward(t, remote_port, ...)``: listens on 127.0.0.1 here; each connection gets
  its own upstream to 127.0.0.1:remote_port on the target:
    * ssh: a ``direct-tcpip`` channel (like ``ssh -L``); where the server refuses port
      forwarding, the relay below;
    * proxmox: the node's loopback is not the container's, so a relay process in the
      container (``pct exec ... python -c SOURCE relay PORT``: stdin -> socket -> stdout)
      over one exec channel per connection.
"""

from __future__ import annotations

import io
import logging
import socket
import subprocess
import threading
from typing import IO, Callable, Sequence

from ..common.errors import ConfigError, ConnectError
from . import command as cmd
from .base import Transport
from .proxmox import ProxmoxTransport
from .ssh import SSHTransport

log = logging.getLogger("dfo")

_CHUNK = 1 << 16


class Pipe:
    """A running process: ``send``/``recv`` bytes, ``shutdown_write`` (EOF), ``close``."""

    def send(self, data: bytes) -> None: ...

    def recv(self, n: int = _CHUNK) -> bytes:
        raise NotImplementedError

    def shutdown_write(self) -> None: ...
    def close(self) -> None: ...

    def readline(self) -> bytes:
        """One line of stdout (b"" at EOF). Not to be mixed with ``recv``."""
        buf = getattr(self, "_buf", b"")
        while b"\n" not in buf:
            data = self.recv()
            if not data:
                self._buf = b""
                return buf
            buf += data
        line, self._buf = buf.split(b"\n", 1)
        return line + b"\n"


class _ProcPipe(Pipe):
    def __init__(self, argv: Sequence[str]):
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        # both are pipes; stdout buffered (bufsize -1), so it has read1
        assert self.proc.stdin is not None and isinstance(self.proc.stdout, io.BufferedReader)
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout = self.proc.stdout

    def send(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def recv(self, n: int = _CHUNK) -> bytes:
        return self.stdout.read1(n)

    def shutdown_write(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.shutdown_write()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stdout.close()


class _ChannelPipe(Pipe):
    """A paramiko channel (exec or direct-tcpip); stderr of an exec is drained and logged."""

    def __init__(self, chan):
        self.chan = chan

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def recv(self, n: int = _CHUNK) -> bytes:
        return self.chan.recv(n)

    def shutdown_write(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:  # noqa: BLE001 - the channel may be gone already
            pass

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass


class _SocketPipe(Pipe):
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, n: int = _CHUNK) -> bytes:
        return self.sock.recv(n)

    def shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def _drain_stderr(chan, what: str) -> None:
    def run():
        try:
            while True:
                data = chan.recv_stderr(_CHUNK)
                if not data:
                    return
                log.debug("%s: %s", what, data.decode("utf-8", "replace").rstrip())
        except Exception:  # noqa: BLE001
            return
    threading.Thread(target=run, daemon=True, name="dfo-pipe-stderr").start()


def open_pipe(t: Transport, argv: Sequence[str]) -> Pipe:
    """Start ``argv`` on the target with a live stdin/stdout."""
    argv = cmd.check_argv(argv)
    if t.is_local:
        return _ProcPipe(argv)
    if not isinstance(t, SSHTransport):
        raise ConnectError(f"cannot start {argv[0]} on {t.name}: the {t.kind} transport opens no "
                           "channel", hint="use an ssh or proxmox host")
    if isinstance(t, ProxmoxTransport):
        t.ensure_running()
    conn = t.conn
    try:
        chan = conn.transport().open_session(timeout=conn.settings.connect_timeout)
        chan.exec_command(t.render(argv, None, None))
    except ConnectError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConnectError(f"cannot start {argv[0]} on {t.name}: {e or type(e).__name__}",
                           hint="check the host and run the command again") from None
    _drain_stderr(chan, argv[0])
    return _ChannelPipe(chan)


def _pump(src: Pipe, dst: Pipe) -> None:
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.send(data)
    except Exception:  # noqa: BLE001 - either side went away: end this direction
        pass
    dst.shutdown_write()


class LocalForward:
    """127.0.0.1:``port`` here -> 127.0.0.1:``remote_port`` on the target.

    ``relay_argv(port)``: the argv of a relay process on the target (for proxmox, and for
    ssh servers that refuse port forwarding)."""

    def __init__(self, t: Transport, remote_port: int, *, relay_argv: Callable[[int], list[str]],
                 port: int = 0):
        self.transport = t
        self.remote_port = remote_port
        self.relay_argv = relay_argv
        self.direct = t.kind == "ssh"
        self.connections = 0
        self.sock = listen(port)
        self.port = self.sock.getsockname()[1]
        self._closed = False
        self._th = threading.Thread(target=self._accept, daemon=True, name="dfo-forward")
        self._th.start()

    def _upstream(self) -> Pipe:
        t = self.transport
        if self.direct and isinstance(t, SSHTransport):
            try:
                chan = t.conn.transport().open_channel(
                    "direct-tcpip", ("127.0.0.1", self.remote_port), ("127.0.0.1", 0),
                    timeout=t.conn.settings.connect_timeout)
                return _ChannelPipe(chan)
            except ConnectError:
                raise
            except Exception as e:  # noqa: BLE001 - e.g. AllowTcpForwarding no
                log.info("port forwarding refused by %s (%s); relaying through a process",
                         self.transport.name, e)
                self.direct = False
        return open_pipe(self.transport, self.relay_argv(self.remote_port))

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        down = _SocketPipe(client)
        try:
            up = self._upstream()
        except Exception as e:  # noqa: BLE001
            log.warning("forward to %s:%d failed: %s", self.transport.name, self.remote_port, e)
            client.close()
            return
        self.connections += 1
        th = threading.Thread(target=_pump, args=(down, up), daemon=True)
        th.start()
        _pump(up, down)
        th.join(30)
        up.close()
        down.close()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        except OSError:
            pass
        self._th.join(5)
        self.sock.close()


def listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port (0: any free port)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        s.close()
        raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {e.strerror}",
                          hint="pick another --port, or leave it out for a free one") from None
    s.listen(16)
    return s


def port_free(port: int) -> bool:
    try:
        listen(port).close()
        return True
    except ConfigError:
        return False
