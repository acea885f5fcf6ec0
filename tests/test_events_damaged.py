"""Lines of events.jsonl that are not events (garbage, invalid bytes, a torn write): ``dfo
logs`` and ``dfo logs -f`` skip them and say how many in one line; they are never printed as
if they were an attempt's output. The real CLI and follower on the local transport; the run
directory is a finished run's, written by hand."""

from __future__ import annotations

import json
import subprocess
import sys

from dfo_contract import events as ev
from orchestrator.engine.logs import LogFollower
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import REPO, hosts_yaml, make_root

DFO = [sys.executable, "-m", "orchestrator.cli"]


def _finished_run_with_garbage(root, run_id: str) -> None:
    d = root / "runs" / run_id
    d.mkdir(parents=True)
    good = [ev.SupervisorStart(pid=1, mode="setsid", resumed=False, t=10.0),
            ev.AttemptStart(attempt=1, resume=None, overrides={}, argv=["x"], pid=2,
                            log="attempt-1.log", t=11.0),
            ev.AttemptEnd(attempt=1, exit_code=0, signal=None, duration_s=1.0, t=12.0),
            ev.Final(status="done", reason="reached max_steps at step 4", last_checkpoint=None,
                     t=13.0)]
    lines = [ev.encode_line(e) for e in good]
    data = (lines[0] + b"garbage that is no JSON\n" + lines[1] + b"\xff\xfe\x00\x81 bytes\n"
            + lines[2] + b'{"kind": "attempt_st' + b"\n" + lines[3])
    (d / "events.jsonl").write_bytes(data)
    (d / "attempt-1.log").write_text("hello from the trainer\n")
    (d / "state.json").write_text(json.dumps({"run_id": run_id, "run_name": "g",
                                              "status": "done", "pid": 1, "attempt": 1,
                                              "ended_at": 13.0}))


def test_follower_skips_and_counts_lines_that_are_not_events(tmp_path):
    root = make_root(tmp_path)
    _finished_run_with_garbage(root, "g-1")
    got, skipped = [], []
    f = LogFollower(LocalTransport("local"), HostTree(str(root)), "g-1", on_line=got.append,
                    follow=True, on_skipped=skipped.append)
    assert f.run() == "done"
    assert skipped == [3]
    kinds = [ln.event.kind for ln in got if ln.file == "events.jsonl"]
    assert kinds == ["supervisor_start", "attempt_start", "attempt_end", "final"]
    assert all(ln.event is not None for ln in got if ln.file == "events.jsonl")


def test_logs_and_logs_follow_say_how_many_lines_were_skipped(tmp_path):
    root = make_root(tmp_path)
    _finished_run_with_garbage(root, "g-1")
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    for extra in ([], ["-f"]):
        r = subprocess.run([*DFO, "--hosts", str(hosts), "logs", *extra, "--run", "g-1"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stderr
        assert "None" not in r.stdout and "garbage" not in r.stdout, r.stdout
        assert "hello from the trainer" in r.stdout
        notes = [ln for ln in r.stderr.splitlines() if "skipped" in ln]
        assert notes == ["dfo: skipped 3 lines of events.jsonl that are not an event (garbage, "
                         "invalid bytes or a torn write)"], r.stderr
