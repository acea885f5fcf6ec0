"""The real CLI on the local transport says what happened, with cli.md's exit codes: `stop`
within a short --timeout names it and what the run is doing, a typo in `export --engines`
is exit 2 before anything is exported, exit 11 lists what exists, `logs --json` gives one
JSON object per line, and a run directory removed under `logs -f` is exit 11 naming it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


from orchestrator.cli import main
from orchestrator.engine.runs import RunOps
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import dfo, fake_run, local_host, wait_final, wait_for

OWN = Path(__file__).resolve().parent / "fixtures" / "own"
PATTERN = r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"


def test_stop_past_its_timeout_names_the_timeout_and_the_run_then_stops(local_site, capsys):
    root, hosts, _ = local_site
    rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", "--backoff-scale", "0.01",
                       "--run-name", "slow", "--json", "--step-pattern", PATTERN,
                       "--", sys.executable,
                       str(OWN / "slow_stop_train.py"), "--stop-s", "2")
    assert rc == 0, err
    run_id = json.loads(out)["run_id"]
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    try:
        wait_for(lambda: (run_ops.one(run_id).state.last_step or 0) >= 1, timeout=60,
                 what="the own trainer's first step")
        rc, out, err = dfo(capsys, hosts, "stop", "--run", run_id, "--timeout", "0.3")
    finally:
        run_ops.stop(run_id, timeout=60)
    assert rc == 10, (out, err)
    assert "within 0.3s" in err and "within 0s" not in err and "stopping" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert wait_final(run_ops, run_id, timeout=60)["status"] == "stopped"
    rc, out, _ = dfo(capsys, hosts, "stop", "--run", run_id)
    assert rc == 0 and "not live" in out


def test_an_unknown_engine_is_exit_2_before_anything_is_exported(local_site, capsys):
    root, hosts, tmp = local_site
    fake_run(root, "tiny-20261201-010000")
    to = tmp / "out"
    rc, out, err = dfo(capsys, hosts, "export", "--engines", "vllm,tensorrt", "--to", str(to))
    assert rc == 2, (out, err)
    assert "unknown engine 'tensorrt'" in err and "llama.cpp" in err and out == ""
    assert not to.exists() and not (root / "exports").exists()


def test_export_of_an_unknown_run_lists_the_runs(local_site, capsys):
    root, hosts, tmp = local_site
    fake_run(root, "tiny-20261201-010000")
    rc, out, err = dfo(capsys, hosts, "export", "--run", "nosuch", "--to", str(tmp / "o"))
    assert rc == 11 and "no run nosuch" in err and "tiny-20261201-010000" in err, err


def test_pull_of_an_unknown_key_lists_the_snapshots(local_site, capsys):
    root, hosts, tmp = local_site
    rc, out, err = dfo(capsys, hosts, "warm-cache", "--pull", str(tmp), "--key", "nosuch")
    assert rc == 11 and "no snapshot for key nosuch" in err, err
    assert "there are no snapshots" in err


def test_logs_json_is_one_object_per_line(local_site, capsys):
    root, hosts, _ = local_site
    rd = fake_run(root, "tiny-20261201-010000")
    (rd / "events.jsonl").write_text(json.dumps({"kind": "supervisor_start", "mode": "setsid",
                                                 "pid": 1, "resumed": False,
                                                 "t": time.time()}) + "\n")
    rc, out, err = dfo(capsys, hosts, "logs", "--json", "--run", "tiny-20261201-010000")
    assert rc == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    texts = [o for o in objs if o["file"] == "attempt-2.log"]
    assert [o["text"] for o in texts] == ["attempt 2 says hi"] and texts[0]["attempt"] == 2
    evs = [o for o in objs if o["file"] == "events.jsonl"]
    assert evs and evs[0]["event"]["kind"] == "supervisor_start"
    rc, _, err = dfo(capsys, hosts, "logs", "--json", "--raw")
    assert rc == 2 and "--raw and --json" in err


def test_logs_follow_of_a_removed_run_directory_is_exit_11_naming_it(local_site, capsys):
    root, hosts, _ = local_site
    rd = fake_run(root, "tiny-20261201-010000")
    shutil.rmtree(rd)
    rc, out, err = dfo(capsys, hosts, "logs", "-f", "--run", "tiny-20261201-010000")
    assert rc == 11 and "tiny-20261201-010000" in err and "Traceback" not in err, err


def test_logs_follow_in_a_pipe_prints_a_line_at_least_every_interval(local_site):
    """cli.md: in a pipe, at least one line every DFO_PROGRESS_EVERY seconds while waiting,
    also while the run prints nothing (a compile, a warm-up)."""
    import os
    import subprocess

    from tests.supervisor_env import live_looking_run

    root, hosts, _ = local_site
    sup = live_looking_run(root / "runs" / "live-20261201-010000-abcdef")
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts),
                          "logs", "-f", "--run", "live-20261201-010000-abcdef"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, DFO_PROGRESS_EVERY="2",
                                  PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    try:
        seen: list[tuple[float, str]] = []
        while len(seen) < 3:
            line = p.stdout.readline()
            assert line, f"dfo logs -f ended: {seen}"
            seen.append((time.monotonic(), line.strip()))
    finally:
        p.kill()
        p.wait()
        sup.kill()
        sup.wait()
    beats = [(t, s) for t, s in seen if "waiting for the run" in s]
    assert len(beats) >= 2, seen
    gaps = [b[0] - a[0] for a, b in zip(beats, beats[1:], strict=False)]
    assert all(g < 2 + 2.5 for g in gaps), gaps


def test_a_long_classified_reason_is_printed_once_by_logs(capsys):
    from dfo_contract import events as ev
    from orchestrator.cli.log_lines import LinePrinter
    from orchestrator.engine.logs import LogLine

    why = ("disk full: the filesystem at /root/.dfo/checkpoints/demo has 0 bytes free "
           "(needs 12.0 MiB for a checkpoint)")
    p = LinePrinter(raw=False)
    for e in (ev.Classified(t=1.0, attempt=1, cls="disk_full", reason=why, evidence=[], also=[]),
              ev.GiveUp(t=2.0, cls="disk_full", reason="a permanent error: restarting cannot "
                        "help", evidence=[]),
              ev.Final(t=3.0, status="failed", reason=f"disk_full ({why}): a permanent error: "
                       "restarting cannot help", last_checkpoint=None)):
        p(LogLine("events.jsonl", 1, ev.encode_line(e).decode(), None, e))
    out = capsys.readouterr().out
    assert out.count(why) == 1, out
    assert "run failed: disk_full (the reason above): a permanent error" in out


def test_a_group_on_the_embedded_default_says_what_it_needs(tmp_path, monkeypatch, capsys):
    """The README's `dfo launch --group pair` needs a hosts.yaml group: on the embedded
    default it says so in one line (exit 2), and the README says it too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    rc = main(["launch", "--group", "pair", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "--group pair: the embedded default inventory has one host (local) and no groups" \
        in err and "hosts.yaml" in err and "docs/multinode.md" in err
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "needs a hosts.yaml naming group `pair`" in readme
    assert "Each line but the last works as written" in readme
