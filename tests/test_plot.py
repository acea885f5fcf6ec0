"""``dfo plot``: the pure curves (plan.curves) and a PNG from a real supervised run."""

from __future__ import annotations

import json
import struct

import pytest

from dfo_contract import events as ev
from dfo_contract.metrics_record import parse_metrics
from orchestrator.plan import curves as cv

# --- pure -----------------------------------------------------------------------------------


def _m(step, attempt, **kw):
    return json.dumps({"step": step, "attempt": attempt, "phase": "train", **kw})


METRICS = "\n".join([
    _m(1, 1, loss=3.0, acc=0.1, tau=1.1, tokens_per_s=100.0),
    _m(2, 1, loss=2.5, acc=0.2, tau=1.2, tokens_per_s=110.0),
    _m(3, 1, loss=None, acc=0.2, tau=1.2, tokens_per_s=110.0),
    '{"step": 4, "loss": 2.',                       # torn last line of a killed attempt
    _m(3, 2, loss=2.4, acc=0.3, tau=1.3, tokens_per_s=60.0, accept_len=1.7),
    _m(4, 2, loss=2.2, acc=0.35, tau=1.4, tokens_per_s=62.0, accept_len=1.8),
    _m(5, 3, loss=2.0, acc=0.4, tau=1.5, tokens_per_s=61.0),
])

EVENTS = "\n".join(ev.encode_line(e).decode().rstrip("\n") for e in [
    ev.AttemptStart(attempt=1, resume=None, overrides={}, argv=["trainer"], pid=10,
                    log="attempt-1.log"),
    ev.Classified(attempt=1, cls="oom", reason="out of memory", evidence=[], also=[]),
    ev.Fallback(attempt=1, cls="oom", step="halve_micro_batch",
                changed={"train.micro_batch": 4}, overrides={"train.micro_batch": 4},
                restore_cache=False),
    ev.Restart(attempt=2, delay_s=0.5, reason="restart 1/5 for oom"),
    ev.AttemptStart(attempt=2, resume="/r/checkpoints/t/step_2",
                    overrides={"train.micro_batch": 4}, argv=["trainer"], pid=11,
                    log="attempt-2.log"),
    ev.Fallback(attempt=2, cls="crash", step="same", changed={},
                overrides={"train.micro_batch": 4}, restore_cache=False),
    ev.AttemptStart(attempt=3, resume=None, overrides={"train.micro_batch": 4},
                    argv=["trainer"], pid=12, log="attempt-3.log"),
    ev.Final(status="done", reason="trainer finished", last_checkpoint=None),
])


def test_series_split_per_attempt_and_skip_missing():
    recs = parse_metrics(METRICS)
    assert [r.step for r in recs] == [1, 2, 3, 3, 4, 5]
    s = cv.series(recs, "loss")
    assert [(x.attempt, x.steps, x.values) for x in s] == [
        (1, (1, 2), (3.0, 2.5)), (2, (3, 4), (2.4, 2.2)), (3, (5,), (2.0,))]


def test_boundaries_at_resume_step_with_fallback_labels():
    b = cv.boundaries(ev.read_events(EVENTS), parse_metrics(METRICS))
    assert b == [
        cv.Boundary(2, 2, "attempt 2: oom -> halve_micro_batch (train.micro_batch=4)"),
        cv.Boundary(3, 5, "attempt 3: crash -> same config"),
    ]


def test_boundary_of_an_attempt_that_logged_nothing():
    more = EVENTS + "\n" + ev.encode_line(ev.AttemptStart(
        attempt=4, resume=None, overrides={}, argv=["trainer"], pid=13,
        log="attempt-4.log")).decode()
    b = cv.boundaries(ev.read_events(more), parse_metrics(METRICS))
    assert b[-1] == cv.Boundary(4, None, "attempt 4")


def test_resumed_step():
    assert cv.resumed_step("/x/checkpoints/run/step_120") == 120
    assert cv.resumed_step("/x/step_7/") == 7
    assert cv.resumed_step("/x/latest") is None and cv.resumed_step(None) is None


def test_panels_pick_up_new_acceptance_fields():
    c = cv.curves("r1", METRICS, EVENTS)
    assert c.status == "done" and not c.empty
    titles = [t for t, _ in c.panels]
    assert titles == ["loss", "acceptance", "throughput (tok/s)"]
    acc_names = {s.name for s in c.panels[1][1]}
    assert acc_names == {"tau", "acc", "accept_len"}
    assert [s.values for s in c.panels[2][1]] == [(100.0, 110.0, 110.0), (60.0, 62.0), (61.0,)]


def test_no_metrics_is_empty():
    assert cv.curves("r", "", EVENTS).empty


# --- a real run ---------------------------------------------------------------------------

def png_size(path) -> tuple[int, int]:
    data = open(path, "rb").read(32)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_plot_of_a_real_run_with_a_fallback(tmp_path, tiny_assets, capsys, monkeypatch):  # noqa: F811
    pytest.importorskip("matplotlib")
    from orchestrator.cli import main
    from orchestrator.engine import plot as pl
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport
    from tests.supervisor_env import (FAST, hosts_yaml, local_host, make_root, wait_final,
                                      write_config)

    root = make_root(tmp_path)
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="t", fault="fx_race@6",
                                    backoff_scale=0.01, thresholds=dict(FAST), env_check=False))
    assert wait_final(run_ops, plan.run_id)["status"] == "done"
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)

    c = pl.fetch_curves(run_ops, plan.run_id)
    assert [b.attempt for b in c.boundaries] == [2]
    assert c.boundaries[0].label.startswith("attempt 2: fx_trace_race -> layout_ddp")
    assert c.boundaries[0].step == 4

    out = tmp_path / "pics" / "run.png"
    out.parent.mkdir()
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "plot", "--run", plan.run_id, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert png_size(out) == (pl.WIDTH_PX, pl.HEIGHT_PX)

    # no --out, stdout not a terminal: the default path (in the current directory), printed;
    # no --run: the newest run
    monkeypatch.chdir(tmp_path)
    assert main(["--hosts", str(hosts), "plot"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / f"{plan.run_id}.png")
    assert png_size(printed) == (pl.WIDTH_PX, pl.HEIGHT_PX)

    # an --out that cannot be written: one line, exit 2, no partial file
    bad = tmp_path / "no-such-dir" / "x.png"
    assert main(["--hosts", str(hosts), "plot", "--out", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dfo: error: cannot write {bad}") and "\n" not in err

    # an unknown run: one line, exit 11
    assert main(["--hosts", str(hosts), "plot", "--run", "nosuchrun"]) == 11
    err = capsys.readouterr().err.strip()
    assert err.startswith("dfo: error: no run nosuchrun") and "\n" not in err


def test_without_matplotlib_the_hint_fits_how_dfo_was_installed(tmp_path):
    """matplotlib made unimportable (a package of that name that raises ImportError first on
    the path): one line, exit-2 ConfigError, with the install command for this checkout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    block = tmp_path / "block" / "matplotlib"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('blocked for a test')\n")
    code = ("from orchestrator.engine.plot import render\n"
            "try:\n    render(None, 'x.png')\nexcept Exception as e:\n"
            "    print(type(e).__name__, e.exit_code, e, '|', e.hint)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo,
                       env=dict(os.environ, PYTHONPATH=f"{block.parent}:{repo}"), timeout=120)
    assert r.stdout.startswith("ConfigError 2 dfo plot needs matplotlib on this machine ("), r
    hint = r.stdout.split("|", 1)[1].strip()
    if Path(sys.prefix).resolve().parent == repo:        # the checkout's .venv (scripts/*.sh)
        rel = Path(sys.prefix).resolve().relative_to(repo)
        assert hint == f"install it with `{rel}/bin/pip install -e '.[plot]'`"
    else:                                                # another env of this checkout
        assert hint == f"install it with `{sys.executable} -m pip install -e '{repo}[plot]'`"
