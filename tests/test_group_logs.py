"""engine.group_logs: one follower per node, merged, each reconnecting on its own.

Two roots (two "nodes" on the local transport), a writer per node appending to its run
dir like the supervisor and trainer do; node b's follower is SIGKILLed mid-stream twice
(a dropped SSH connection). Every line of both nodes arrives once, tagged with its node,
and following ends when both runs are final."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.engine.group_logs import follow_group
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport
from tests.test_logs_follow import REPO, KillingTransport, expected_lines


def node_root(tmp_path, name):
    r = tmp_path / name
    (r / "envs").mkdir(parents=True)
    (r / "runs" / "w").mkdir(parents=True)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), r / "envs" / "current")
    return r


def test_merged_follow_reconnects_per_node_and_ends_when_all_are_final(tmp_path):
    roots = {n: node_root(tmp_path, n) for n in ("a", "b")}
    # node b's run ends only after its second kill (its writer goes on until then): both
    # kills land on a live stream however the machine schedules writer and follower
    hold = tmp_path / "release-b"
    writers = [subprocess.Popen([sys.executable, str(REPO / "tests" / "logs_writer.py"),
                                 str(r / "runs" / "w"), "40", "0.002",
                                 *([str(hold)] if n == "b" else [])], stdout=subprocess.PIPE)
               for n, r in roots.items()]
    killer = KillingTransport(kill_after=15, times=2, release=hold)
    nodes = [("a", LocalTransport("local"), HostTree(str(roots["a"]))),
             ("b", killer, HostTree(str(roots["b"])))]
    got: list[tuple[str, str, str]] = []
    reconnects: list[str] = []
    outs = follow_group(nodes, "w", on_line=lambda h, ln: got.append((h, ln.file, ln.text)),
                        follow=True, poll=0.05,
                        on_reconnect=lambda h, n, why: reconnects.append(h))
    assert all(w.wait(60) == 0 for w in writers)
    assert [(o.host, o.ok, o.value) for o in outs] == [("a", True, "done"), ("b", True, "done")]
    assert killer.kills == 2 and set(reconnects) == {"b"}
    for host, r in roots.items():
        for name in ("events.jsonl", "attempt-1.log", "attempt-2.log"):
            mine = [t for h, f, t in got if h == host and f == name]
            assert mine == expected_lines(r / "runs" / "w", name), (host, name)


def test_a_node_without_the_run_does_not_hide_the_other(tmp_path):
    a, b = node_root(tmp_path, "a"), node_root(tmp_path, "b")
    w = subprocess.run([sys.executable, str(REPO / "tests" / "logs_writer.py"),
                        str(a / "runs" / "w"), "5", "0"], capture_output=True, timeout=60)
    assert w.returncode == 0
    (b / "runs" / "w").rmdir()
    got: list[str] = []
    outs = follow_group([("a", LocalTransport("local"), HostTree(str(a))),
                         ("b", LocalTransport("local"), HostTree(str(b)))], "w",
                        on_line=lambda h, ln: got.append(h))
    assert outs[0].ok and outs[0].value == "done" and set(got) == {"a"}
    assert not outs[1].ok and outs[1].exit_code == 11 and "run w" in outs[1].error
