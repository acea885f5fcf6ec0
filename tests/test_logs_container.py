"""``dfo logs -f`` over the proxmox transport when the container stops under it: the same
check as ``dfo status`` (``pct status``), the same one line (exit 5, "container N on HOST is
stopped (start it: ...)") and it ends, instead of reconnecting into a stopped container.

A real OpenSSH sshd on 127.0.0.1 plays the Proxmox node (``make_sshd``); its ``pct`` is a
small stand-in on the daemon's PATH whose "container" is this machine: ``pct exec`` runs the
command here while the state file says running and fails like lxc-attach once it says
stopped; stopping the container is writing that state and killing what ran in it (the real
follower). The CLI, the transport and the follower are dfo's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.supervisor_env import REPO, live_looking_run, make_root, wait_for

pytestmark = pytest.mark.lab

DFO = [sys.executable, "-m", "orchestrator.cli"]

PCT = """#!/bin/bash
# pct stand-in: the "container" is this machine, its state a file beside this script
here=$(dirname "$0")
state=$(cat "$here/state")
case "$1" in
  status) echo "status: $state" ;;
  exec)
    if [ "$state" != running ]; then
      echo "lxc-attach: dfo-$2: attach.c: get_attach_context: 405 Failed to get init pid" >&2
      exit 1
    fi
    shift 2
    while [ "$1" != "--" ]; do shift; done
    shift
    exec "$@" ;;
  *) echo "pct stand-in: $1 is not supported" >&2; exit 255 ;;
esac
"""


def _followers(run_dir) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.supervisor.follow" in cmd and str(run_dir).encode() in cmd:
            out.append(int(p))
    return out


def test_logs_follow_ends_when_the_container_stops(tmp_path, make_sshd):
    pct_dir = tmp_path / "pct"
    pct_dir.mkdir()
    (pct_dir / "pct").write_text(PCT)
    (pct_dir / "pct").chmod(0o755)
    (pct_dir / "state").write_text("running\n")
    info = make_sshd(path_dirs=[str(pct_dir)])
    root = make_root(tmp_path)
    run_dir = root / "runs" / "r-1"
    sup = live_looking_run(run_dir)
    ssh = {"host": info.host, "port": info.port, "user": info.user,
           "identity_file": info.identity_file, "known_hosts": info.known_hosts}
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: lab\nhosts:\n  lab:\n    transport: proxmox\n"
                     f"    ssh: {json.dumps(ssh)}\n    vmid: 201\n    root: {root}\n")
    dfo = subprocess.Popen([*DFO, "--hosts", str(hosts), "logs", "-f", "--run", "r-1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        wait_for(lambda: _followers(run_dir), 120, "the follower to run")
        # the container stops: its state says so and what ran in it is gone
        (pct_dir / "state").write_text("stopped\n")
        for pid in _followers(run_dir):
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = dfo.communicate(timeout=60)
        assert time.monotonic() - t0 < 60
    finally:
        if dfo.poll() is None:
            dfo.kill()
            dfo.communicate()
        sup.kill()
        sup.wait()
    assert dfo.returncode == 5, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["dfo: error: container 201 on lab is stopped "
                     "(start it: ssh 127.0.0.1 pct start 201)"], err
    assert "reconnecting" not in err and "Traceback" not in err
