"""``dfo tensorboard``: TensorBoard started on the target, reachable on this machine's loopback.

Local transport for real (the CLI as a subprocess: URL, HTTP 200, SIGINT stops both);
the relay forward on loopback; the ssh forward (direct-tcpip) and the proxmox relay (through
``pct exec``) against the lab.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from trainer.telemetry.tbevents import ScalarWriter

REPO = Path(__file__).resolve().parents[1]
DFO = [sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"]
START_S = 300  # TensorBoard's first start imports a lot; the machine is shared


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


def make_run(root: Path, run_id: str = "r1") -> Path:
    d = root / "runs" / run_id
    w = ScalarWriter(str(d))
    for s in (1, 2, 3):
        w.write(s, {"loss": 1.0 / s, "tau": 1.0 + s, "acc_per_pos": [0.5, 0.25]})
    w.close()
    return d


def hosts_file(tmp_path: Path, root: Path) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n    root: {root}\n")
    return p


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url: str, timeout: float = 60) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}")


def procs_with(text: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmd and "tensorboard" in cmd.decode("utf-8", "replace"):
                out.append(int(pid))
    return out


pytest.importorskip("tensorboard")


# --- local transport --------------------------------------------------------------------------

def test_local_tensorboard_serves_and_sigint_stops_it(tmp_path):
    root = tmp_path / "root"
    logdir = make_run(root)
    hosts = hosts_file(tmp_path, root)
    port = free_port()
    p = subprocess.Popen([*DFO, "--hosts", str(hosts), "tensorboard", "--run", "r1",
                          "--python", sys.executable, "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         cwd=str(tmp_path))
    try:
        line = p.stdout.readline()  # blocks until the URL is printed (or dfo exited)
        assert line.startswith("TensorBoard for r1: "), (line, p.poll(), p.stderr.read()
                                                         if p.poll() is not None else "")
        url = f"http://127.0.0.1:{port}/"
        assert url in line
        status, _ = get(url)
        assert status == 200
        status, body = get(url + "data/plugin/scalars/tags")
        tags = json.loads(body)
        assert {"loss", "tau", "acc_per_pos/0"} <= set(tags["."]), tags
        assert procs_with(str(logdir))                    # TensorBoard runs on that run dir
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "dfo: tensorboard stopped" in err and "Traceback" not in err
    assert refused(port)
    wait_until(lambda: not procs_with(str(logdir)), 30, "TensorBoard to stop with dfo")


def test_missing_tensorboard_is_one_line(tmp_path):
    root = tmp_path / "root"
    make_run(root)
    hosts = hosts_file(tmp_path, root)
    bare = tmp_path / "bare-python"   # an interpreter without site-packages: no tensorboard
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    r = subprocess.run([*DFO, "--hosts", str(hosts), "tensorboard", "--run", "r1",
                        "--python", str(bare)], capture_output=True, text=True, env=_env(),
                       timeout=120)
    assert r.returncode == 7, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfo: error: tensorboard is not installed")
    assert "--python PATH" in lines[0]


def test_unknown_run_is_exit_11(tmp_path):
    root = tmp_path / "root"
    make_run(root)
    r = subprocess.run([*DFO, "--hosts", str(hosts_file(tmp_path, root)), "tensorboard",
                        "--run", "nosuchrun", "--python", sys.executable],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 11, r.stderr
    assert r.stderr.startswith("dfo: error: no run nosuchrun") and r.stderr.count("\n") == 1


# --- the relay forward, on loopback -------------------------------------------------------------

class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = f"hello {self.path}".encode() * 5000  # larger than one chunk
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def hello_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def test_relay_forward_carries_http(hello_server):
    from orchestrator.engine.tensorboard import serve_argv
    from orchestrator.transport.forward import LocalForward
    from orchestrator.transport.local import LocalTransport

    fwd = LocalForward(LocalTransport(), hello_server,
                       relay_argv=lambda p: serve_argv(sys.executable, "relay", str(p)))
    try:
        assert not fwd.direct
        for path in ("/a", "/b"):
            status, body = get(f"http://127.0.0.1:{fwd.port}{path}")
            assert status == 200 and body == f"hello {path}".encode() * 5000
        assert fwd.connections == 2
    finally:
        fwd.close()
    assert refused(fwd.port)


# --- the lab: ssh (direct-tcpip) and proxmox (relay through pct exec) ---------------------------

@pytest.mark.lab
def test_ssh_forward_direct_tcpip(lab, lab_hosts_factory, tmp_path):
    from orchestrator.config.inventory import load_inventory
    from orchestrator.engine.runs import RunOps
    from orchestrator.engine.tensorboard import TensorBoard
    from orchestrator.transport import open_transport

    node_root = tmp_path / "node-root"       # lab-node is this machine's sshd
    logdir = make_run(node_root)
    inv = load_inventory(str(lab_hosts_factory(node_root=str(node_root))))
    host = inv.get("lab-node")
    t = open_transport(host)
    try:
        tb = TensorBoard(RunOps(t, host), "r1", python=sys.executable)
        url = tb.start()
        try:
            status, body = get(url + "data/plugin/scalars/tags")
            assert status == 200 and "loss" in json.loads(body)["."]
            assert tb.forward.direct and tb.forward.connections == 1
            assert procs_with(str(logdir))
        finally:
            tb.close()
        assert refused(tb.forward.port)
        wait_until(lambda: not procs_with(str(logdir)), 30, "TensorBoard to stop")
    finally:
        t.close()


SERVE_UNTIL_EOF = r"""
import http.server, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("in the container " + self.path).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=s.serve_forever, daemon=True).start()
print(s.server_address[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.lab
def test_proxmox_relay_through_pct_exec(lab, lab_hosts_file, tmp_path):
    from orchestrator.config.inventory import load_inventory
    from orchestrator.engine.tensorboard import serve_argv
    from orchestrator.transport import open_transport
    from orchestrator.transport.forward import LocalForward, open_pipe

    inv = load_inventory(str(lab_hosts_file))
    t = open_transport(inv.get("lab"))
    try:
        srv = open_pipe(t, ["python3", "-c", SERVE_UNTIL_EOF])
        port = int(srv.readline())
        fwd = LocalForward(t, port, relay_argv=lambda p: serve_argv("python3", "relay", str(p)))
        try:
            assert not fwd.direct       # the node's loopback is not the container's
            status, body = get(f"http://127.0.0.1:{fwd.port}/x")
            assert (status, body) == (200, b"in the container /x")
        finally:
            fwd.close()
            srv.close()               # EOF on its stdin, through pct exec: it exits
        probe = ["python3", "-c", "import socket,sys\ntry:\n socket.create_connection(('127.0.0.1',"
                 f"{port}),timeout=2)\nexcept OSError:\n sys.exit(1)"]
        wait_until(lambda: t.run(probe, timeout=30).exit_code == 1, 30,
                   "the server in the container to stop on EOF")
    finally:
        t.close()

    # the CLI on the proxmox host: the container's python3 has no tensorboard -> one line, 7
    r = subprocess.run([*DFO, "--hosts", str(lab_hosts_file), "tensorboard", "--host", "lab",
                        "--run", "r1", "--python", "python3"], capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert r.returncode == 7, r.stderr
    assert r.stderr.startswith("dfo: error: tensorboard is not installed") \
        and r.stderr.count("\n") == 1
