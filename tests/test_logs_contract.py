"""`dfo logs` and `dfo plot` read a run's events through dfo_contract: a run written before
records carried a version reads as it did; a record of a newer format stops them with one
line (exit 7), never a misread. Real CLI processes, the local transport and the real
follower on the far side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfo_contract import events as ev
from dfo_contract.runstate import RunState
from tests.supervisor_env import REPO, hosts_yaml, make_root

CLI = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"
FIXTURES = Path(__file__).parent / "fixtures" / "events"
RUN = "old-20261201-150232-1f48c0"


def dfo(hosts: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", CLI, "--hosts", str(hosts), *args],
                          capture_output=True, text=True, cwd=str(REPO), env=env, timeout=300)


@pytest.fixture
def env(tmp_path):
    root = make_root(tmp_path)
    return root, hosts_yaml(tmp_path / "hosts.yaml", root)


def finished_run(root: Path, events_text: str) -> Path:
    rd = root / "runs" / RUN
    rd.mkdir(parents=True)
    st = RunState.new(RUN, "old", now=1796137352.0)
    st.status, st.reason, st.attempt = "done", "reached max_steps at step 20", 2
    (rd / "state.json").write_text(json.dumps(st.to_json()))
    (rd / "events.jsonl").write_text(events_text)
    (rd / "metrics.jsonl").write_text(json.dumps({"step": 1, "attempt": 1, "loss": 2.0}) + "\n")
    return rd


def test_a_run_written_before_versions_reads_as_it_did(env):
    root, hosts = env
    finished_run(root, (FIXTURES / "recorded.jsonl").read_text())
    p = dfo(hosts, "logs", "--run", RUN)
    assert p.returncode == 0, p.stderr
    shown = [ln.split("▶ ", 1)[1] for ln in p.stdout.splitlines() if "▶ " in ln]
    # each line as dfo showed it then; a checkpoint once per (attempt, step), as always
    seen, want = set(), []
    evs = ev.read_events((FIXTURES / "recorded.jsonl").read_text())
    for e, text in zip(evs, (FIXTURES / "recorded.described.txt").read_text().splitlines(), strict=True):
        if isinstance(e, ev.Checkpoint):
            if (e.attempt, e.step) in seen:
                continue
            seen.add((e.attempt, e.step))
        want.append(text)
    assert shown == want


@pytest.mark.parametrize("follow", [False, True])
def test_a_newer_record_version_is_one_line_exit_7(env, follow):
    root, hosts = env
    old = (FIXTURES / "recorded.jsonl").read_text().splitlines()[:3]
    newer = json.dumps({"v": 2, "t": 1796137400.0, "kind": "checkpoint", "attempt": 1,
                        "step": {"n": 10}, "where": "s3://x"})
    finished_run(root, "\n".join([*old, newer]) + "\n")
    p = dfo(hosts, "logs", *(["-f"] if follow else []), "--run", RUN)
    assert p.returncode == 7, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"run {RUN}: events.jsonl: a record of format version 2" in err
    assert "this dfo reads version 1" in err and "use the dfo that deployed" in err
    assert "supervisor started" in p.stdout        # what it could read came first


def test_plot_refuses_a_newer_record_in_one_line(env, tmp_path):
    pytest.importorskip("matplotlib")
    root, hosts = env
    finished_run(root, '{"v": 3, "t": 1, "kind": "final", "status": "done"}\n')
    p = dfo(hosts, "plot", "--run", RUN, "--out", str(tmp_path / "p.png"))
    assert p.returncode == 7, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "\n" not in err and "version 3" in err and "Traceback" not in err
    assert not (tmp_path / "p.png").exists()


def test_a_record_that_breaks_its_kind_is_refused_not_misread(env):
    root, hosts = env
    finished_run(root, json.dumps({"t": 1, "kind": "attempt_end", "attempt": "two",
                                   "exit_code": 0, "signal": None, "duration_s": 1}) + "\n")
    p = dfo(hosts, "logs", "--run", RUN)
    assert p.returncode == 7, (p.stdout, p.stderr)
    assert "'attempt' is str 'two', expected int" in p.stderr
    assert p.stderr.strip().count("\n") == 0
