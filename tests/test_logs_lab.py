"""dfo logs -f over a real SSH connection (the lab's sshd) while the sshd process serving
that connection is killed: no line lost, none repeated, checked against the remote files."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.engine.logs import LogFollower
from orchestrator.transport import open_transport
from tests.lab_sockets import client_port, sshd_pids_serving
from tests.supervisor_env import FAST, live_looking_run, make_root, write_config  # noqa: F401

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture
def node(lab, lab_hosts_factory, tmp_path):
    root = make_root(tmp_path)
    inv = load_inventory(str(lab_hosts_factory(node_root=str(root))))
    host = inv.get("lab-node")
    t = open_transport(host)
    yield root, host, t, lab
    t.close()


def test_logs_follow_survives_killed_sshd_session(node, tiny_assets, tmp_path):  # noqa: F811
    root, host, t, lab = node
    run_ops = RunOps(t, host)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 24})
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="drop", fault="fx_race@9",
                                    backoff_scale=0.01, thresholds=FAST, env_check=False))
    got = []
    kills = []
    reconnects = []

    def on_line(ln):
        got.append(ln)
        if len(got) in (25, 70, 120) and len(kills) < 3:
            pids = sshd_pids_serving(lab.ssh_port, client_port(t))
            assert pids, "the sshd serving this connection"
            for p in pids:
                os.kill(p, signal.SIGKILL)
            kills.append(pids)

    f = LogFollower(t, host.tree, plan.run_id, on_line=on_line, follow=True,
                    on_reconnect=lambda n, why: reconnects.append(why))
    status = f.run()
    assert status == "done"
    assert len(kills) >= 2 and len(reconnects) >= 2
    # compare with the files on the far side, read on a new connection
    t2 = open_transport(host)
    try:
        for name in {ln.file for ln in got}:
            remote = t2.get(f"{host.tree.run_dir(plan.run_id)}/{name}").decode("utf-8", "replace")
            assert remote.endswith("\n")
            mine = [ln.text for ln in got if ln.file == name]
            assert mine == remote[:-1].split("\n"), name
    finally:
        t2.close()
    assert {"attempt-1.log", "attempt-2.log", "events.jsonl"} <= {ln.file for ln in got}


def _fingerprint(pub_line: str, tmp_path) -> str:
    import subprocess

    f = tmp_path / "k.pub"
    f.write_text(pub_line.strip() + "\n")
    out = subprocess.run(["ssh-keygen", "-lf", str(f)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


def test_logs_follow_stops_at_once_on_a_changed_host_key(sshd_only, tmp_path):
    """The host key changes while `logs -f` follows (the connection drops, the reconnect
    meets another key): HostKeyError (exit 4) at once, with both fingerprints, not a
    reconnect loop ending in exit 3."""
    import subprocess

    from orchestrator.common.errors import HostKeyError
    from orchestrator.transport import knownhosts  # noqa: F401 - the format of known_hosts

    lab = sshd_only
    root = make_root(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(open(lab.known_hosts).read())
    text = lab.hosts_yaml(node_root=str(root)).replace(str(lab.known_hosts), str(kh))
    (tmp_path / "hosts.yaml").write_text(text)
    host = load_inventory(str(tmp_path / "hosts.yaml")).get("lab-node")
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    other_pub = (tmp_path / "other_key.pub").read_text().split()
    t = open_transport(host)
    swapped = []

    def on_line(ln):
        if swapped:
            return
        # the host "was reinstalled": known_hosts now holds another key for it
        kh.write_text(f"[{lab.ssh_host}]:{lab.ssh_port} {other_pub[0]} {other_pub[1]}\n")
        for p in sshd_pids_serving(lab.ssh_port, client_port(t)):
            os.kill(p, signal.SIGKILL)
        swapped.append(1)

    reconnects = []
    f = LogFollower(t, host.tree, "live-1", on_line=on_line, follow=True, max_retries=3,
                    sleep=lambda s: None, on_reconnect=lambda n, why: reconnects.append(why))
    # a run that looks live (its supervisor a stand-in): the follower never ends by itself
    sup = live_looking_run(root / "runs" / "live-1")
    try:
        with pytest.raises(HostKeyError) as ei:
            f.run()
    finally:
        t.close()
        sup.kill()
        sup.wait()
    msg = str(ei.value)
    assert ei.value.exit_code == 4 and swapped
    assert "REMOTE HOST KEY CHANGED" in msg and "\n" not in msg
    assert _fingerprint(lab.host_public_key, tmp_path) in msg        # what it offers now
    assert _fingerprint(" ".join(other_pub), tmp_path) in msg        # what known_hosts has
    assert len(reconnects) <= 1


def _followers_of(run_dir: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cl = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"orchestrator.supervisor.follow" in cl and run_dir.encode() in cl:
                out.append(int(p))
    return out


def test_remote_follower_does_not_outlive_its_connection(sshd_only, tmp_path):
    """`dfo logs -f` is gone (its SSH connection killed) while the run has nothing new to
    say: the follower on the host exits too (its next keepalive write fails)."""
    import sys
    import threading

    from orchestrator.common.errors import DfoError
    from tests.supervisor_env import REPO, wait_for

    lab = sshd_only
    root = tmp_path / "root"
    bin_ = root / "envs" / "current" / "bin"
    bin_.mkdir(parents=True)
    # the host's env runs this checkout's follower (the node is this machine)
    (bin_ / "python").write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} \"$@\"\n")
    (bin_ / "python").chmod(0o755)
    (tmp_path / "hosts.yaml").write_text(lab.hosts_yaml(node_root=str(root)))
    host = load_inventory(str(tmp_path / "hosts.yaml")).get("lab-node")
    rd = root / "runs" / "live-1"
    t = open_transport(host)
    first = threading.Event()

    def follow():
        try:
            t.stream(LogFollower(t, host.tree, "live-1", on_line=None, follow=True).argv(),
                     lambda ln: first.set())
        except DfoError:
            pass   # the connection we kill below

    sup = live_looking_run(rd)   # the run looks live: the follower never ends by itself
    th = threading.Thread(target=follow, daemon=True)
    th.start()
    try:
        assert first.wait(60), "the follower's first line"
        pids = _followers_of(str(rd))
        assert pids, "the follower on the host"
        for p in sshd_pids_serving(lab.ssh_port, client_port(t)):
            os.kill(p, signal.SIGKILL)          # the client side is gone
        wait_for(lambda: not _followers_of(str(rd)), 60, "the orphaned follower to exit")
    finally:
        for p in _followers_of(str(rd)):
            os.kill(p, signal.SIGKILL)
        t.close()
        sup.kill()
        sup.wait()
