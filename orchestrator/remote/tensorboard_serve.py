"""Far side of ``dfo tensorboard``. Standard library only: dfo sends this file's text as
``python -c SOURCE MODE ...``, so it runs under any interpreter (the deployed env's, or
``--python``) whether or not dfo is installed there.

``serve LOGDIR PORT``: start TensorBoard (``python -m tensorboard.main``) bound to
127.0.0.1:PORT (0: a free port), wait until it answers, print ``{"port": N, "pid": P}``;
then keep it running while this process's stdin stays open. EOF on stdin (dfo exited or
its SSH channel closed) or a new parent (``pct exec`` gone) stops TensorBoard; the last
line is ``{"exit": rc}``. Errors are one JSON line ``{"error": ..., "detail": ...}``, exit 3.

``relay PORT``: connect to 127.0.0.1:PORT and copy bytes stdin -> socket and socket ->
stdout until both sides are done (the port forward of proxmox hosts: one per connection).
"""

import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

START_TIMEOUT_S = 180.0


def say(**rec):
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def fail(error, detail=""):
    say(error=error, detail=detail)
    sys.exit(3)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


def stop(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    return proc.returncode


def serve(logdir, port):
    if importlib.util.find_spec("tensorboard") is None:
        fail("no-tensorboard", sys.executable)
    if not os.path.isdir(logdir):
        fail("no-logdir", logdir)
    port = port or free_port()
    tail = []

    def drain(stream):
        for line in iter(stream.readline, b""):
            tail.append(line.decode("utf-8", "replace").rstrip())
            del tail[:-20]

    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "5"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    threading.Thread(target=drain, args=(proc.stdout,), daemon=True).start()
    parent = os.getppid()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not answers(port):
            if proc.poll() is not None:
                time.sleep(0.2)
                fail("exited", " | ".join(tail[-3:]) or f"exit {proc.returncode}")
            if time.monotonic() > deadline:
                fail("timeout", f"no answer on 127.0.0.1:{port} after {START_TIMEOUT_S:.0f}s")
            if stdin_closed(0.2) or os.getppid() != parent:
                fail("cancelled")
        say(port=port, pid=proc.pid)
        while proc.poll() is None:
            if stdin_closed(1.0) or os.getppid() != parent:
                break
    finally:
        rc = stop(proc)
    say(exit=rc, detail=" | ".join(tail[-3:]))


def stdin_closed(timeout):
    """True once stdin is at EOF (anything read before EOF is ignored)."""
    try:
        r, _, _ = select.select([0], [], [], timeout)
        if not r:
            return False
        return os.read(0, 4096) == b""
    except OSError:
        return True


def relay(port):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        sys.stderr.write(f"relay: cannot connect to 127.0.0.1:{port}: {e}\n")
        sys.exit(3)
    sock.settimeout(None)

    def upstream():
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            out.write(data)
            out.flush()
    except OSError:
        pass
    sock.close()


def main(argv):
    if len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], int(argv[2]))
    elif len(argv) == 2 and argv[0] == "relay":
        relay(int(argv[1]))
    else:
        sys.stderr.write("usage: serve LOGDIR PORT | relay PORT\n")
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
