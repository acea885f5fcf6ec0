"""After a demo-like run on the local host (the default config and run name, the demo's
injected FX-tracing failure), as a person continues: the demo's recap of that run (from its
events, printed in a real terminal of 80 columns), the time it lost in ``dfo status --json``
and its final event, and the README's resume line run as written. Real CLI, local transport,
real trainer on CPU.

compile.enabled=false in these runs: the demo's config compiles, which costs about a minute
per attempt on a 2-core machine; the supervisor, the checkpoints and the failure are the
same without it (the injected FX error is raised either way)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dfo_contract import events as ev
from orchestrator.config.runconfig import DEFAULT_RUN_NAME, demo_paths
from orchestrator.config.host_tree import HostTree
from orchestrator.plan.recap import recap
from tests.supervisor_env import hosts_yaml, make_root
from tests.test_tmux_cli import REPO, Tmux

pytestmark = pytest.mark.slow

#: for speed only (module doc): no compile, a held-out evaluation of a few samples
FAST = ["--no-env-check", "--backoff-scale", "0.01", "--set", "compile.enabled=false",
        "--set", "eval.max_samples=4"]


def dfo(hosts: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def readme_resume_line() -> list[str]:
    """The README's line that resumes the demo's run, as its words."""
    m = re.search(r"^dfo launch --resume step_\d+[^#\n]*", (REPO / "README.md").read_text(), re.M)
    assert m, "README.md shows no `dfo launch --resume step_N ...` line"
    return m.group(0).split()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, tiny_assets):  # noqa: F811
    """A finished demo-like run: `dfo launch -f` on the defaults with the demo's fault."""
    base = tmp_path_factory.mktemp("demo-run")
    root = make_root(base)
    p = demo_paths(HostTree(str(root)))   # where `dfo demo` puts its assets
    shutil.copytree(tiny_assets / "target", p["target"])
    shutil.copy(tiny_assets / "synth.jsonl", p["data"])
    shutil.copy(tiny_assets / "synth.jsonl", p["eval"])
    hosts = hosts_yaml(base / "hosts.yaml", root)
    r = dfo(hosts, "launch", "-f", "--fault", "fx_race@150", *FAST, cwd=base)
    assert r.returncode == 0, r.stdout + r.stderr
    (rid,) = os.listdir(root / "runs")
    return root, hosts, rid, base


def _events(root: Path, rid: str) -> list:
    return ev.read_events((root / "runs" / rid / "events.jsonl").read_text())


def test_the_recap_says_what_happened_in_the_run(demo_run):
    root, hosts, rid, _ = demo_run
    assert rid.startswith(f"{DEFAULT_RUN_NAME}-")
    rec = recap(_events(root, rid))
    assert rec.status == "done" and rec.attempts == 2
    assert rec.failure_cls == "fx_trace_race" and rec.failure_reason
    assert "using FX to symbolically trace a dynamo-optimized function" in rec.failure_line
    # compile is off here (speed), so the ladder passes over compile_gate, which could not
    # change this run, to its next step (the demo itself compiles and gets compile_gate)
    assert rec.fallback.startswith("layout_ddp"), rec.fallback
    ck = root / "checkpoints" / DEFAULT_RUN_NAME
    assert rec.resumed_from == str(ck / "step_140")
    g = rec.time
    assert g.train_s > 0 and 0 < g.goodput < 1 and not g.live
    assert g.train_s + g.lost_total_s == pytest.approx(g.wall_s, abs=0.01)
    # steps 141..149 ran twice: after the step-140 report, until the error showed
    assert g.lost("redone") > 0 and g.lost("detection") > 0 and g.lost("startup") > 0 and g.lost("restart") > 0
    assert rec.accept_first[0] == 40 and rec.accept_last[0] == 200
    lines = rec.lines()
    assert lines[0].startswith("run done after 2 attempt(s)")
    assert any(ln.startswith("time lost: ") and "redone" in ln for ln in lines)
    assert any(ln.startswith("acceptance length: ") and "at step 40 -> " in ln for ln in lines)


def test_status_json_and_the_final_event_carry_the_time_lost(demo_run):
    root, hosts, rid, cwd = demo_run
    r = dfo(hosts, "status", "--json", "--run", rid, cwd=cwd)
    assert r.returncode == 0, r.stderr
    (run,) = json.loads(r.stdout)["runs"]
    t = run["time"]
    assert t["version"] == 1 and 0 < t["goodput"] < 1 and t["live"] is False
    assert set(t["lost_s"]) == {"startup", "compile", "detection", "restart", "redone", "other"}
    final = [e for e in _events(root, rid) if isinstance(e, ev.Final)][0]
    assert final.goodput == pytest.approx(t["goodput"], abs=0.01)
    assert final.lost_s["redone"] == pytest.approx(t["lost_s"]["redone"], abs=0.01)
    ends = [e for e in _events(root, rid) if isinstance(e, ev.AttemptEnd)]
    assert ends[0].from_step == 0 and ends[1].from_step == 140 and ends[1].last_step == 200


def test_the_recap_in_a_terminal_of_80_columns(demo_run):
    _, hosts, rid, cwd = demo_run
    t = Tmux(80, 50)
    try:
        t.type(f"cd {cwd}; python -c 'from orchestrator.cli.context import AppContext; "
               "from orchestrator.cli.demo import print_recap; "
               f"print_recap(AppContext(\"{hosts}\"), \"local\", 312)'; echo rc=$?")
        s = t.wait_for("rc=", 120)
    finally:
        t.close()
    assert "rc=0" in s, s
    assert f"what happened in {rid}" in s
    assert "failure: fx_trace_race" in s and "fallback: layout_ddp" in s
    assert "time lost: " in s and "goodput " in s and "the demo took 5m12s in all" in s
    for cmd in ("dfo status", "dfo plot", "dfo export --to DIR",
                " ".join(readme_resume_line())):
        assert f"\n  {cmd}\n" in s, cmd
    # nothing but a path is wider than the terminal
    body = s[s.index("what happened"):s.index("rc=")]
    assert all(len(ln) <= 80 for ln in body.splitlines() if "/" not in ln), body


def test_the_readme_resume_line_resumes_the_demo_checkpoint(demo_run):
    root, hosts, rid, cwd = demo_run
    words = readme_resume_line()
    assert words[:2] == ["dfo", "launch"]
    step = words[words.index("--resume") + 1]
    r = dfo(hosts, *words[1:], *FAST, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    new = sorted(set(os.listdir(root / "runs")) - {rid})
    assert len(new) == 1 and new[0].startswith(f"{DEFAULT_RUN_NAME}-")
    evs = _events(root, new[0])
    start = [e for e in evs if isinstance(e, ev.AttemptStart)][0]
    assert start.resume == str(root / "checkpoints" / DEFAULT_RUN_NAME / step)
    end = [e for e in evs if isinstance(e, ev.AttemptEnd)][0]
    max_steps = int(next(w.split("=")[1] for w in words if w.startswith("train.max_steps=")))
    assert end.from_step == int(step.split("_")[1]) and end.last_step == max_steps
    assert [e for e in evs if isinstance(e, ev.Final)][0].status == "done"
