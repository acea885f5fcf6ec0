"""The everyday CLI surface without a host: click's usage errors as dfo's one line (exit 2),
``python -m orchestrator.cli``, shell completion, the generated docs/cli.md, ``dfo diagnose``
on a finished log, the demo's run id, the pure sparkline/step helpers, plain progress."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from rich.console import Console

from dfo_contract.state_records import CheckpointRef
from orchestrator.plan.run_identity import make_run_id
from dfo_contract.metrics_record import parse_metrics
from orchestrator.common.sparkline import current_step, metrics_tail, sparkline

REPO = Path(__file__).resolve().parents[1]
DFO = [sys.executable, "-m", "orchestrator.cli"]


def run_dfo(args, cwd, env=None):
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([*DFO, *args], capture_output=True, text=True, cwd=cwd, env=e, timeout=120)


@pytest.mark.parametrize("argv, what", [
    (["diagnose", "/tmp"], "dfo diagnose: invalid value for 'LOGFILE'"),
    (["--bogus"], "dfo: no such option '--bogus'"),
    (["logs", "--attempt", "abc"], "dfo logs: invalid value for '--attempt': 'abc' is not a valid integer"),
    (["status", "--bogus"], "dfo status: no such option '--bogus'"),
    (["diagnose"], "dfo diagnose: missing argument 'LOGFILE'"),
    (["hosts", "nope"], "dfo hosts: no such command 'nope'"),
])
def test_usage_errors_are_one_line_exit_2(argv, what, tmp_path):
    r = run_dfo(argv, tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr          # no usage block
    assert r.stderr.startswith("dfo: error: ") and what in r.stderr
    assert "Usage:" not in r.stderr and "Try '" not in r.stderr
    assert r.stderr.rstrip().endswith("--help`)")       # how to fix it


def test_python_dash_m_and_completion_script(tmp_path):
    r = run_dfo(["--help"], tmp_path)
    assert r.returncode == 0 and "warm-cache" in r.stdout and "Usage: dfo" in r.stdout
    for shell, marker in (("bash", "_dfo_completion"), ("zsh", "#compdef dfo"),
                          ("fish", "complete --no-files --command dfo")):
        r = run_dfo([], tmp_path, env={"_DFO_COMPLETE": f"{shell}_source"})
        assert r.returncode == 0 and marker in r.stdout, (shell, r.stdout[:200], r.stderr)
    # the completion itself answers
    r = run_dfo([], tmp_path, env={"_DFO_COMPLETE": "bash_complete", "COMP_WORDS": "dfo sta",
                                   "COMP_CWORD": "1"})
    assert "status" in r.stdout and "stop" not in r.stdout


def test_committed_cli_md_is_the_generated_one():
    from orchestrator.cli.docgen import render

    committed = (REPO / "docs" / "cli.md").read_text()
    assert committed == render(), ("docs/cli.md differs from the click definitions: "
                                   "run `python -m orchestrator.cli.docgen > docs/cli.md`")


def test_docgen_picks_up_every_command_and_option():
    from orchestrator.cli import cli
    from orchestrator.cli.docgen import render

    @click.command("frobnicate")
    @click.option("--level", type=int, default=3, show_default=True, help="How hard.")
    def frob(level):
        """Frobnicate the run."""

    g = click.Group("dfo", commands=dict(cli.commands, frobnicate=frob), params=cli.params)
    out = render(g, "{{SUMMARY}}\n{{REFERENCE}}")
    assert "| `dfo frobnicate` | Frobnicate the run. | - |" in out
    assert "| `--level INTEGER` | How hard. (default: 3) |" in out
    # options a hand-written table would miss are there
    for opt in ("--run-name", "--fault", "--backoff-scale", "--threshold", "--budget", "--fallbacks",
                "--no-env-check", "--timeout", "--wide", "--watch"):
        assert f"`{opt}" in out, opt


def test_diagnose_done_log_is_not_a_failure(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_text('step 110 loss 1.2\n@dfo {"kind": "step", "step": 120}\n'
                   '@dfo {"kind": "checkpoint", "step": 120, "path": "x"}\n'
                   '@dfo {"kind": "done", "step": 120}\n'
                   '@dfo {"kind": "heartbeat", "phase": "exit"}\n')
    r = run_dfo(["diagnose", str(log)], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("done:"), r.stdout
    assert "fallback: none (the run finished)" in r.stdout
    # a done marker followed by a crash is a crash
    log.write_text(log.read_text() + "Traceback (most recent call last):\nRuntimeError: boom\n"
                   '@dfo {"kind": "step", "step": 121}\n')
    r = run_dfo(["diagnose", str(log)], tmp_path)
    assert not r.stdout.startswith("done:"), r.stdout


def test_demo_run_id_has_one_timestamp():
    from orchestrator.cli.demo import launch_args
    from orchestrator.config.runconfig import DEFAULT_RUN_NAME

    args = launch_args("local", "fx_race@30")
    assert "--config" not in args and "--run-name" not in args   # the defaults are the demo's
    rid = make_run_id(DEFAULT_RUN_NAME, 1_790_000_000)
    assert rid.count("2026") + rid.count("2027") == 1 and rid.startswith("demo-")
    assert "--new-lineage" in args   # an earlier demo's checkpoints are not resumed


def test_sparkline_and_current_step():
    assert sparkline([]) == "" and sparkline(["x", None, float("nan")]) == ""
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▄▄▄"
    assert sparkline(range(100), width=8) == "▁▂▃▄▅▆▇█"
    assert len(sparkline([3, 1, 2, float("inf"), 9], 8)) == 4
    assert current_step(100, 110, None) == 110 and current_step(None, None) is None
    assert current_step(True, -1, 7) == 7
    lines = ['{"step": 90, "tokens_per_s": 10.0}', '{"step": 100, "tokens_per_s": 12}',
             'torn {"step', '[1]', '{"step": 110, "tokens_per_s": NaN}']
    assert metrics_tail(parse_metrics("\n".join(lines))) == (110, [10.0, 12.0])


def test_status_step_is_current_and_has_the_trend(tmp_path):
    """state.json says step 100; metrics.jsonl and the newest checkpoint are at 110."""
    from orchestrator.supervisor.query import run_info
    from orchestrator.supervisor.runfiles import write_state
    from dfo_contract.runstate import RunState

    rd = tmp_path / "r1"
    rd.mkdir()
    st = RunState.new("r1", "r", now=time.time())
    st.status, st.last_step, st.tokens_per_s = "done", 100, 50.0
    st.last_checkpoint = CheckpointRef(step=110, path="/c/step_110")
    write_state(str(rd), st)
    (rd / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "tokens_per_s": {s / 2}}}\n'
                                              for s in range(10, 111, 10)))
    info = run_info(str(rd))
    assert info.state.last_step == 110 and info.recent_tokens_per_s[-1] == 55.0
    from orchestrator.cli.status import status_table

    buf = io.StringIO()
    Console(file=buf, width=80).print(status_table("h", [info], width=80))
    out = buf.getvalue()
    assert "110" in out and "▁" in out and "█" in out


def test_checkpoint_is_printed_once(capsys):
    from dfo_contract.events import Checkpoint
    from orchestrator.cli.log_lines import LinePrinter
    from orchestrator.engine.logs import LogLine

    p = LinePrinter(raw=False)
    p(LogLine("events.jsonl", 1, "", None, Checkpoint(attempt=1, step=120,
                                                      path="/c/step_120", t=0)))
    p(LogLine("attempt-1.log", 1, '@dfo {"kind": "checkpoint", "step": 120, "path": "x"}', 1, None))
    p(LogLine("attempt-1.log", 2, '@dfo {"kind": "checkpoint", "step": 140, "path": "y"}', 1, None))
    out = capsys.readouterr().out
    assert out.count("120") == 1 and out.count("140") == 1, out


def test_activity_in_a_pipe_prints_timestamped_lines_at_a_steady_pace():
    from orchestrator.cli.console import Activity

    buf = io.StringIO()
    con = Console(file=buf, width=4096, force_terminal=False)
    with Activity("warm-cache", con=con, every=0.2) as act:
        act.update("warmup: compiling 2 shapes")
        deadline = time.monotonic() + 30
        while buf.getvalue().count("still working") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        act.update("warmup: second shape")
        act.line("[green]✓[/] done")
    lines = buf.getvalue().splitlines()
    # a change before 0.2 s is not printed; the steady lines carry the newest text
    assert "warm-cache: warmup: compiling 2 shapes (still working, " in lines[0]
    assert any("warm-cache: warmup: second shape (" in ln for ln in lines)
    assert sum("still working" in ln for ln in lines) >= 2
    assert all(ln[:2].isdigit() and ln[2] == ":" and ln[5] == ":" for ln in lines)
    assert lines[-1].endswith("✓ done") and "[green]" not in lines[-1]


def test_activity_in_a_terminal_shows_a_running_clock_while_nothing_changes():
    from orchestrator.cli.console import Activity

    buf = io.StringIO()
    con = Console(file=buf, width=80, force_terminal=True)
    with Activity("demo assets", con=con) as act:
        act.update("making a tiny Qwen3 target " + "and teaching it " * 6)
        deadline = time.monotonic() + 30
        while "(0m01s)" not in buf.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    out = buf.getvalue()
    # the clock comes before the text: at 80 columns the text is cut, the clock is not
    assert "demo assets (0m00s): making a tiny" in out and "demo assets (0m01s): making" in out


def test_console_in_a_pipe_never_cuts(tmp_path):
    from orchestrator.cli.status import status_table

    path = "/very/long/" + "x" * 150 + "/step_110"
    runs = [{"run_id": "a-run-name-that-is-long-20261201-031500", "status": "running",
             "last_step": 5, "fallbacks": [{"step": "compile_gate"}],
             "last_event": f"checkpoint step 110 at {path}"}]
    code = ("import json,sys; from orchestrator.cli.console import console; "
            "from orchestrator.cli.status import status_table; "
            "from dfo_contract.status import RunStatus; "
            "console().print(status_table('h', [RunStatus.from_json(r) "
            "for r in json.loads(sys.argv[1])]))")
    import json

    r = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80"),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert path in r.stdout and "…" not in r.stdout and "\x1b[" not in r.stdout
    assert status_table  # imported for the subprocess's sake


def test_follow_in_a_pipe_says_alive_during_quiet_stretches(capsys):
    from orchestrator.cli.log_lines import LinePrinter
    from orchestrator.engine.logs import LogLine

    p = LinePrinter(raw=False)
    hb = '@dfo {"kind": "heartbeat", "phase": "warmup", "step": 0}'
    p(LogLine("attempt-1.log", 1, hb, 1, None))            # just started: nothing yet
    assert capsys.readouterr().out == ""
    p.quiet_since -= 10                                       # 10 s without a readable line
    p(LogLine("attempt-1.log", 2, hb, 1, None))
    p(LogLine("attempt-1.log", 3, hb, 1, None))               # the next beat: too soon
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith("a1│ alive: warmup step 0") and out[0][2] == ":"


def test_deploy_stage_view_in_a_pipe():
    from orchestrator.cli.deploy import _StageView

    buf = io.StringIO()
    view = _StageView(Console(file=buf, width=4096, force_terminal=False))
    view("uv", "start", None, "creating the venv")
    view("uv", "done", 1.5, "created /root/.dfo/envs/cpu-0123 [with brackets]")
    view("verify", "skip", None, "up to date")
    view.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "✓ uv" in lines[0] and "[with brackets]" in lines[0]
    assert "· verify" in lines[1] and all(ln[2] == ":" for ln in lines)


def test_warm_cache_result_folds_a_long_snapshot_path_at_80_columns():
    """In a terminal of 80 columns the snapshot's path folds onto the next lines, whole."""
    tar = "/root/.dfo/cache/snapshots/" + "k" * 90 + "/snapshot-20261201.tar"
    code = ("import sys; from orchestrator.cli.cache import _print_result; "
            "from orchestrator.engine.cache_warmup import WarmResult; "
            "_print_result(WarmResult(host='local', key='k1', action='warmed', "
            "snapshot_size=10, cache_size=20, tar=sys.argv[1]), {}, False)")
    r = subprocess.run([sys.executable, "-c", code, tar], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80",
                                FORCE_COLOR="1", TERM="xterm"), timeout=60)
    assert r.returncode == 0, r.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert all(len(ln) <= 80 for ln in plain.splitlines()), plain
    assert "…" not in plain
    assert tar in "".join(ln.strip() for ln in plain.splitlines()), plain
