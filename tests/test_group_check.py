"""The group judges (plan/group_check.py, pure) and the port probe they read
(orchestrator/remote/port_probe.py) run for real over loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from dataclasses import replace

from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.replies import PortRecord
from orchestrator.plan import group_check as gc
from tests.lab.procs import free_port_pair

FP = EnvFingerprint(profile="cpu", lock_hash="a" * 64, dfo="0.1.0", python="3.11.7",
                    torch="2.11.0+cu130", torch_git="abc", torch_cuda="13.0", triton="3.5.0",
                    transformers="5.17.0", device_count=8)


def test_envs_agree():
    other = replace(FP, device_count=2)   # a node with fewer GPUs runs the same env
    assert gc.env_differences("pair", ["gpu1", "gpu2"], {"gpu1": FP, "gpu2": other}) == []


def test_env_difference_names_host_what_and_fix():
    d = gc.env_differences("pair", ["gpu1", "gpu2", "gpu3"],
                           {"gpu1": FP, "gpu2": replace(FP, torch="2.11.0+cu128", torch_cuda="12.8"),
                            "gpu3": FP})
    assert len(d) == 1 and d[0].host == "gpu2" and d[0].head == "gpu1"
    assert str(d[0]) == ("gpu2's env differs from gpu1's (torch 2.11.0+cu128 vs 2.11.0+cu130; "
                         "torch CUDA 12.8 vs 13.0): run dfo deploy --group pair")
    assert d[0].to_json()["message"] == str(d[0])


def test_env_lock_hash_is_shortened():
    d = gc.env_differences("g", ["a", "b"], {"a": FP, "b": replace(FP, lock_hash="b" * 64)})
    assert "lock bbbbbbbbbbbb vs aaaaaaaaaaaa" in str(d[0])


def test_missing_envs_and_unreached_hosts():
    d = gc.env_differences("g", ["a", "b", "c"], {"a": FP, "b": None})   # c not reached
    assert [str(x) for x in d] == ["no env deployed on b: run dfo deploy --group g"]
    d = gc.env_differences("g", ["a", "b"], {"a": None, "b": FP})
    assert [str(x) for x in d] == ["no env deployed on the head a: run dfo deploy --group g"]
    assert gc.env_differences("g", ["a", "b"], {"b": FP}) == []  # head not reached: nothing to compare


def test_profile_differences():
    assert gc.profile_differences("g", ["a", "b"], {"a": "cpu", "b": "cpu"},
                                  {"a": "cpu", "b": None}) == []
    d = gc.profile_differences("g", ["a", "b"], {"a": "cpu", "b": "gpu-cu130"}, {})
    assert "hosts.yaml gives profile gpu-cu130 vs cpu" in str(d[0]) and d[0].host == "b"
    d = gc.profile_differences("g", ["a", "b"], {"a": "cpu", "b": "cpu"},
                               {"a": "cpu", "b": "gpu-cu130"})
    assert str(d[0]) == "b: its env is profile gpu-cu130, hosts.yaml says cpu: run dfo deploy --group g"


def _recs(objs):
    """The probe's records as ``parse_port_lines`` gives them."""
    return [PortRecord.from_json(d) for d in objs]


def test_parse_port_lines_skips_noise():
    lines = ["hello", '@dfo-port {"event": "bind", "port": 1, "ok": true}', "@dfo-port {bad",
             '@dfo-port [1]', '  @dfo-port {"event": "listening", "ports": [1]}']
    assert [r.event for r in gc.parse_port_lines(lines)] == ["bind", "listening"]


def test_judge_reach():
    listen = _recs([{"event": "bind", "port": 29400, "ok": True},
                    {"event": "bind", "port": 29401, "ok": True}, {"event": "listening"}])
    ok = _recs([{"event": "connect", "port": 29400, "ok": True},
                {"event": "connect", "port": 29401, "ok": True}])
    bad = _recs([{"event": "connect", "port": 29400, "ok": False, "error": "No route to host"},
                 {"event": "connect", "port": 29401, "ok": True}])
    r = gc.judge_reach("gpu1", "10.0.0.1", [29400, 29401], listen, None,
                       {"gpu2": ok, "gpu3": bad, "gpu4": "ssh: connection refused"})
    assert [(x.host, x.ok, x.role) for x in r] == [("gpu1", True, "head"), ("gpu2", True, "member"),
                                                  ("gpu3", False, "member"), ("gpu4", False, "member")]
    assert r[2].message == "cannot reach 10.0.0.1:29400 from gpu3: No route to host"
    assert r[3].message == "cannot reach 10.0.0.1:29400 from gpu4: ssh: connection refused"


def test_judge_reach_port_taken_and_an_address_not_of_the_host():
    listen = _recs([{"event": "bind", "port": 29400, "ok": False, "errno": "EADDRINUSE",
                     "error": "Address already in use"},
                    {"event": "bind", "port": 29401, "ok": True}, {"event": "listening"}])
    r = gc.judge_reach("gpu1", "10.0.0.1", [29400, 29401], listen, None,
                       {"gpu2": _recs([{"event": "connect", "port": 29401, "ok": True}])})
    assert not r[0].ok and "port 29400 is already taken on gpu1" in r[0].message
    assert r[1].ok and r[1].message == "reaches 10.0.0.1:29401"
    listen = _recs([{"event": "bind", "port": p, "ok": False, "errno": "EADDRNOTAVAIL",
                     "error": "Cannot assign requested address"} for p in (29400, 29401)])
    r = gc.judge_reach("gpu1", "10.0.0.9", [29400, 29401], listen, None, {"gpu2": []})
    assert "10.0.0.9 is not an address of gpu1" in r[0].message and "fix head_addr" in r[0].message
    assert not r[1].ok and "not tried" in r[1].message
    r = gc.judge_reach("gpu1", "h", [1, 2], None, "ssh: timed out", {})
    assert r == [gc.Reach("gpu1", False, "cannot start a listener on gpu1: ssh: timed out", "head")]


def test_port_probe_for_real_over_loopback():
    """The listener and the connector as dfo runs them (python -c SOURCE, argv only)."""
    port = free_port_pair()
    ports = [port]
    lst = subprocess.Popen(gc.listen_argv(sys.executable, "127.0.0.1", ports, expected=2, seconds=60),
                           stdout=subprocess.PIPE, text=True)
    lines = []
    ready = threading.Event()

    def read():
        for line in lst.stdout:
            lines.append(line)
            if '"listening"' in line:
                ready.set()
    th = threading.Thread(target=read, daemon=True)
    th.start()
    assert ready.wait(60)
    out = []
    for hello in ("gpu2", "gpu3"):
        r = subprocess.run(gc.connect_argv(sys.executable, "127.0.0.1", ports, hello),
                           capture_output=True, text=True, timeout=60)
        out.append(gc.parse_port_lines(r.stdout.splitlines()))
    assert lst.wait(60) == 0  # it ended by itself: every expected connection came
    th.join(60)               # the reader is at EOF now; the bound only ends a broken run
    recs = gc.parse_port_lines(lines)
    assert [r.hello for r in recs if r.event == "accepted"] == ["gpu2", "gpu3"]
    assert gc.judge_reach("gpu1", "127.0.0.1", ports, recs, None,
                          {"gpu2": out[0], "gpu3": out[1]})[1].ok

    # nothing listens now: refused, said in the probe's words
    r = subprocess.run(gc.connect_argv(sys.executable, "127.0.0.1", ports, "x", timeout=5),
                       capture_output=True, text=True, timeout=60)
    rec = gc.parse_port_lines(r.stdout.splitlines())[0]
    assert rec.ok is False and rec.errno == "ECONNREFUSED"


def test_port_probe_taken_port_and_stop():
    with socket.socket() as hold:
        hold.bind(("127.0.0.1", 0))
        hold.listen()
        taken = hold.getsockname()[1]
        free = free_port_pair()
        lst = subprocess.Popen(gc.listen_argv(sys.executable, "127.0.0.1", [taken, free], expected=5,
                                              seconds=120), stdout=subprocess.PIPE, text=True)
        first = [lst.stdout.readline() for _ in range(3)]
        recs = gc.parse_port_lines(first)
        assert recs[0].ok is False and recs[0].errno == "EADDRINUSE"
        assert recs[2].event == "listening" and recs[2].ports == [free]
        subprocess.run(gc.connect_argv(sys.executable, "127.0.0.1", [free], "stop"), timeout=60)
        assert lst.wait(60) == 0  # `stop` ended it long before its 120 s
        assert "port %d is already taken" % taken in gc.bind_problems("h", "127.0.0.1", recs)[0]
