"""known_hosts handling (real keys from ssh-keygen), and connection errors against real
sockets on 127.0.0.1 (a closed port, a server that never speaks SSH)."""

from __future__ import annotations

import socket
import subprocess
import threading

import paramiko
import pytest

from orchestrator.common.errors import ConnectError
from orchestrator.transport.settings import SSHSettings
from orchestrator.transport import knownhosts
from orchestrator.transport.ssh import SSHTransport


def keygen(tmp_path, name, kind="ed25519") -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    pub = (tmp_path / f"{name}.pub").read_text().split()
    return paramiko.PKey.from_type_string(pub[0], __import__("base64").b64decode(pub[1]))


def fingerprint_by_ssh_keygen(tmp_path, name) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / f"{name}.pub")], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


def test_fingerprint_matches_ssh_keygen(tmp_path):
    k = keygen(tmp_path, "a")
    assert knownhosts.fingerprint(k) == fingerprint_by_ssh_keygen(tmp_path, "a")
    assert knownhosts.describe_key(k).startswith("ssh-ed25519 SHA256:")


def test_host_key_name():
    assert knownhosts.host_key_name("10.0.0.1", 22) == "10.0.0.1"
    assert knownhosts.host_key_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"


def test_add_status_replace(tmp_path):
    kh = str(tmp_path / "ssh" / "known_hosts")
    a, b, c = keygen(tmp_path, "a"), keygen(tmp_path, "b"), keygen(tmp_path, "c", "ecdsa")
    name = "[127.0.0.1]:2222"
    assert knownhosts.status(kh, name, a) == knownhosts.UNKNOWN
    knownhosts.add(kh, name, a)
    assert (tmp_path / "ssh" / "known_hosts").stat().st_mode & 0o777 == 0o600
    assert knownhosts.status(kh, name, a) == knownhosts.KNOWN
    assert knownhosts.status(kh, name, b) == knownhosts.CHANGED
    assert knownhosts.status(kh, "127.0.0.1", a) == knownhosts.UNKNOWN  # port matters
    # other hosts' lines and comments survive a replace; a shared line only loses our name
    with open(kh, "a") as f:
        f.write("# a comment\n")
        f.write(f"other,{name} {c.get_name()} {c.get_base64()}\n")
    knownhosts.add(kh, name, b, replace=True)
    text = open(kh).read()
    assert "# a comment" in text and f"other {c.get_name()}" in text
    assert knownhosts.status(kh, name, b) == knownhosts.KNOWN
    assert knownhosts.status(kh, name, a) == knownhosts.CHANGED
    assert knownhosts.status(kh, "other", c) == knownhosts.KNOWN
    # paramiko (what connecting uses) reads the file we wrote
    hk = paramiko.HostKeys(kh)
    assert hk.lookup(name)[b.get_name()] == b


def test_hashed_entries(tmp_path):
    kh = tmp_path / "known_hosts"
    a, b = keygen(tmp_path, "a"), keygen(tmp_path, "b")
    name = "[127.0.0.1]:2200"
    hashed = paramiko.HostKeys.hash_host(name)
    kh.write_text(f"{hashed} {a.get_name()} {a.get_base64()}\n")
    assert knownhosts.status(str(kh), name, a) == knownhosts.KNOWN
    assert knownhosts.status(str(kh), name, b) == knownhosts.CHANGED
    knownhosts.add(str(kh), name, b, replace=True)
    assert hashed not in kh.read_text()
    assert knownhosts.status(str(kh), name, b) == knownhosts.KNOWN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_connect_error(tmp_path):
    s = SSHSettings(host="127.0.0.1", port=_free_port(), user="root",
                    known_hosts=str(tmp_path / "kh"), connect_timeout=3)
    t = SSHTransport("box", s)
    with pytest.raises(ConnectError) as ei:
        t.run(["true"])
    msg = str(ei.value)
    assert type(ei.value) is ConnectError and ei.value.exit_code == 3
    assert "cannot reach box (root@127.0.0.1:" in msg and "connection refused" in msg
    assert "check ssh.host and ssh.port" in msg


@pytest.fixture
def silent_server():
    """A TCP server on 127.0.0.1 that accepts and then says nothing (or not SSH)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    conns = []
    stop = threading.Event()
    mode = {"reply": b""}

    def loop():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            conns.append(c)
            if mode["reply"]:
                c.sendall(mode["reply"])
                c.close()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    yield srv.getsockname()[1], mode
    stop.set()
    th.join(2)
    for c in conns:
        c.close()
    srv.close()


def test_timeout_is_connect_error(tmp_path, silent_server):
    port, _ = silent_server
    s = SSHSettings(host="127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"), connect_timeout=1)
    with pytest.raises(ConnectError) as ei:
        SSHTransport("box", s).run(["true"])
    assert "box" in str(ei.value) and "\n" not in str(ei.value)


def test_not_an_ssh_server(tmp_path, silent_server):
    port, mode = silent_server
    mode["reply"] = b"HTTP/1.1 400 Bad Request\r\n\r\n"
    s = SSHSettings(host="127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"), connect_timeout=2)
    with pytest.raises(ConnectError) as ei:
        SSHTransport("box", s).run(["true"])
    assert "box" in str(ei.value)
