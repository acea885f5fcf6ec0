"""Consistent answers of the real CLI on the local transport (a host root whose env is this
venv): unknown run/attempt is exit 11 listing what exists; the default config is the demo's
assets on the host, checked before anything starts; no warm-cache advice for an uncompiled
config; warm-cache without --config names dfo's options, never the trainer's flags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from tests.supervisor_env import dfo, fake_run


def test_unknown_run_or_attempt_is_exit_11_everywhere(local_site, capsys):
    root, hosts, _ = local_site
    fake_run(root, "tiny-20261201-010000")
    rc, out, err = dfo(capsys, hosts, "status", "--run", "nosuchrun")
    assert rc == 11 and err.count("\n") == 1 and "no run nosuchrun" in err
    assert "tiny-20261201-010000" in err and out == ""
    for cmd in (["logs"], ["stop"], ["status", "--watch"]):
        rc, _, err = dfo(capsys, hosts, *cmd, "--run", "nosuchrun")
        assert rc == 11 and "tiny-20261201-010000" in err, (cmd, err)
    rc, out, err = dfo(capsys, hosts, "logs", "--run", "tiny-20261201-010000", "--attempt", "99")
    assert rc == 11 and "has no attempt 99" in err and "attempts: 1, 2" in err and out == ""
    rc, out, err = dfo(capsys, hosts, "logs", "--run", "tiny-20261201-010000", "--attempt", "2")
    assert rc == 0 and "attempt 2 says hi" in out


def test_stop_with_nothing_live_says_so(local_site, capsys):
    root, hosts, _ = local_site
    fake_run(root, "tiny-20261201-010000")
    for args in ([], ["--run", "tiny-20261201-010000"]):
        rc, out, err = dfo(capsys, hosts, "stop", *args)
        assert rc == 0 and out == ("nothing to stop on local: run tiny-20261201-010000 is "
                                   "done, not live\n"), (args, out, err)
    rc, out, _ = dfo(capsys, hosts, "stop", "--json")
    assert rc == 0 and json.loads(out)["nothing_to_stop"] is True


def test_no_runs_says_so(local_site, capsys):
    _, hosts, _ = local_site
    rc, out, err = dfo(capsys, hosts, "status")
    assert rc == 0 and "no runs on local" in out
    rc, out, _ = dfo(capsys, hosts, "status", "--json")
    assert rc == 0 and json.loads(out)["runs"] == []


def test_default_config_is_checked_then_works_after_the_demo_assets(local_site, capsys, tiny_assets):  # noqa: F811
    root, hosts, _ = local_site
    rc, out, err = dfo(capsys, hosts, "launch", "--dry-run", "--no-env-check")
    assert rc == 2 and err.count("\n") == 1, err
    assert "model.target_path of the default config (the demo's)" in err
    from orchestrator.config.runconfig import demo_paths
    from orchestrator.config.host_tree import HostTree

    paths = demo_paths(HostTree(str(root)))     # where `dfo demo` puts its assets
    assert paths["target"] in err and "dfo demo" in err
    assert not (root / "runs").exists()
    (root / "demo").mkdir()
    shutil.copytree(tiny_assets / "target", paths["target"])
    rc, out, err = dfo(capsys, hosts, "launch", "--dry-run", "--no-env-check")
    assert rc == 2 and "data.path of the default config" in err and "--data.path" not in err
    shutil.copy(tiny_assets / "synth.jsonl", paths["data"])
    rc, out, err = dfo(capsys, hosts, "launch", "--dry-run", "--no-env-check")
    assert rc == 2 and "data.eval_path of the default config" in err, err
    shutil.copy(tiny_assets / "synth.jsonl", paths["eval"])
    rc, out, err = dfo(capsys, hosts, "launch", "--dry-run", "--no-env-check")
    assert rc == 0, err
    assert "run demo-" in out     # the default run name is the demo's
    # the default config is the demo's, compile on: warm its cache first
    assert "run `dfo warm-cache`" in err, err
    rc, _, err = dfo(capsys, hosts, "launch", "--dry-run", "--no-env-check",
                     "--set", "compile.enabled=false")
    assert rc == 0 and "warm-cache" not in err, err


def test_missing_data_path_names_the_key(local_site, capsys, tiny_assets, tmp_path):  # noqa: F811
    _, hosts, _ = local_site
    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[1] / "orchestrator/config/defaults/tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"] = str(tiny_assets / "target")
    cfg["data"]["path"] = str(tmp_path / "nope.jsonl")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(p), "--dry-run", "--no-env-check")
    assert rc == 2 and err.count("\n") == 1
    assert f"data.path of {p}: {tmp_path / 'nope.jsonl'} does not exist" in err
    assert "--set data.path=PATH" in err


def test_empty_run_name_is_refused(local_site, capsys):
    _, hosts, _ = local_site
    rc, _, err = dfo(capsys, hosts, "launch", "--run-name", "", "--dry-run", "--no-env-check")
    assert rc == 2 and "--run-name: '' is not a valid run name" in err


def test_warm_cache_without_config_names_dfo_options(local_site, capsys, tmp_path):
    _, hosts, _ = local_site
    rc, _, err = dfo(capsys, hosts, "warm-cache", "--pull", str(tmp_path))
    assert rc == 11 and "no compile-cache snapshots on local" in err, err
    assert "--data.path" not in err and "required" not in err
    rc, _, err = dfo(capsys, hosts, "warm-cache", "--set", "compile.enabled=false")
    assert rc == 2 and "--data.path" not in err
    assert "the default config (the demo's) has compile.enabled false" in err
    assert "--config" in err


def test_warm_cache_after_a_restore_labels_the_snapshots_figures_as_measured_at_save(capsys):
    from orchestrator.cli.cache import _print_result
    from orchestrator.engine.cache_warmup import WarmResult

    common = dict(host="local", key="cpu-abc", cold_s=85.1, warm_s=3.2, snapshot_size=10,
                  cache_size=20)
    _print_result(WarmResult(action="restored", source="snapshot", **common), {}, False)
    out = capsys.readouterr().out
    lines = [ln.strip() for ln in out.splitlines()]
    assert any(ln.startswith("cold warm-up (at save)") and "1m25s" in ln or
               ln.startswith("cold warm-up (at save)") and "85.1" in ln for ln in lines), out
    assert not any(ln.startswith("cold warm-up ") and "(at save)" not in ln for ln in lines), out
    assert any(ln.startswith("saved next start (at save)") for ln in lines), out
    _print_result(WarmResult(action="warmed", **common), {}, False)
    out = capsys.readouterr().out
    assert "(at save)" not in out and any(ln.strip().startswith("cold warm-up ")
                                          for ln in out.splitlines()), out
