"""``dfo export`` through the real CLI on the local transport: a real run's checkpoints (the
trainer on CPU, with the measured acceptance length as eval), exported by the env's python
on the host, copied here and sha256-verified."""

from __future__ import annotations

import io
import json
import os

import pytest

from dfo_contract.fsio import atomic_write_json, sha256_file
from dfo_contract import runstate as rs
from tests.helpers.tmpfs import fill, tmpfs  # noqa: F401
from tests.helpers.trainer import make_synth, make_target, tiny_config
from tests.supervisor_env import dfo, hosts_yaml, make_root


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    from trainer.train.loop import train

    tmp = tmp_path_factory.mktemp("xport")
    root = make_root(tmp)
    hosts = hosts_yaml(tmp / "hosts.yaml", root)
    target = make_target(str(tmp / "target"))
    data = make_synth(str(tmp / "synth.jsonl"), num=24)
    run_id, name = "20260101-000000-tiny", "tiny"
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / rs.STATE_FILE, rs.new_state(run_id, name, now=1.0))
    cfg = tiny_config(target, data, str(run_dir), **{
        "train.max_steps": 4, "checkpoint.dir": str(root / "checkpoints" / name),
        "checkpoint.every": 2, "data.eval_path": data, "eval.every": 2, "eval.max_samples": 8})
    assert train(cfg, out=io.StringIO()) == 0
    return {"root": root, "hosts": hosts, "tmp": tmp, "run_id": run_id}


def test_export_best_to_local_dir(host_run, capsys):
    best = json.loads((host_run["root"] / "checkpoints" / "tiny" / "best").read_text())
    to = host_run["tmp"] / "mine" / "drafter"
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--step", "best", "--to", str(to), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["step"] == best["step"] and res["accept_len"] == pytest.approx(best["accept_len"])
    assert sorted(os.listdir(to)) == ["README.md", "config.json", "dfo_export.json",
                                      "model.safetensors", "modeling_dflash.py"]
    for name, meta in res["files"].items():
        assert sha256_file(to / name) == meta["sha256"]
    assert sorted(os.listdir(to.parent)) == ["drafter"]          # no temp dir left behind
    assert res["remote_dir"].startswith(str(host_run["root"] / "exports" / "tiny"))
    # progress lines (human mode), and a re-export replaces the directory
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--step", "4", "--to", str(to))
    assert rc == 0 and "model.safetensors verified" in err and "exported step 4" in out


def test_export_user_errors_are_one_line(host_run, capsys):
    to = host_run["tmp"] / "x"
    rc, _, err = dfo(capsys, host_run["hosts"], "export", "--step", "soon", "--to", str(to))
    assert rc == 2 and err.startswith("dfo: error: --step") and err.count("\n") == 1
    rc, _, err = dfo(capsys, host_run["hosts"], "export", "--step", "99", "--to", str(to))
    assert rc != 0 and err.startswith("dfo: error:") and err.count("\n") == 1
    assert not to.exists()
    best = host_run["root"] / "checkpoints" / "tiny" / "best"
    kept = best.read_bytes()
    try:
        for damaged in (b'{"step": "four"}', b"{not json"):
            best.write_bytes(damaged)
            rc, _, err = dfo(capsys, host_run["hosts"], "export", "--step", "best", "--to", str(to))
            assert rc == 11 and err.count("\n") == 1 and f"{best} cannot be read" in err, err
            assert "--step N" in err and not to.exists()
    finally:
        best.write_bytes(kept)


def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(host_run, capsys, tmpfs):  # noqa: F811
    fs = tmpfs(256 << 10)
    (fs / "mine").mkdir()
    fill(fs, 0)
    to = fs / "mine" / "drafter"
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--to", str(to))
    errors = [ln for ln in err.splitlines() if not ln.startswith("dfo: exporting ")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"dfo: error: --to {to}: cannot write ")
    assert "No space left on device" in errors[0] and errors[0].endswith(
        " there or give another directory)"), errors[0]
    assert os.listdir(fs / "mine") == []     # no temp dir, no half-written export


@pytest.fixture(scope="module")
def two_lineages(tmp_path_factory, monkeypatch_module):
    """Run A trains steps 2 and 4 into checkpoints/twice/; a launch with --new-lineage moves
    them aside (checkpoints/twice.<stamp>, as launch_plan names it); run B then writes
    step_2 and step_6 into checkpoints/twice/."""
    from trainer.train.loop import train

    tmp = tmp_path_factory.mktemp("lineages")
    root = make_root(tmp)
    hosts = hosts_yaml(tmp / "hosts.yaml", root)
    target = make_target(str(tmp / "target"))
    data = make_synth(str(tmp / "synth.jsonl"), num=24)
    ck = root / "checkpoints" / "twice"
    runs = {}
    for run_id, steps in (("20260101-000000-twice", 4), ("20260102-000000-twice", 6)):
        run_dir = root / "runs" / run_id
        run_dir.mkdir(parents=True)
        atomic_write_json(run_dir / rs.STATE_FILE, rs.new_state(run_id, "twice", now=1.0))
        monkeypatch_module.setenv("DFO_RUN_ID", run_id)
        cfg = tiny_config(target, data, str(run_dir), **{
            "train.max_steps": steps, "checkpoint.dir": str(ck), "checkpoint.every": 2,
            "checkpoint.keep": 2})
        assert train(cfg, out=io.StringIO()) == 0
        st = rs.new_state(run_id, "twice", now=1.0)
        st["last_checkpoint"] = {"step": steps, "path": str(ck / f"step_{steps}")}
        atomic_write_json(run_dir / rs.STATE_FILE, st)
        runs[run_id] = steps
        if len(runs) == 1:
            os.rename(ck, f"{ck}.20260101-120000")
    return {"root": root, "hosts": hosts, "tmp": tmp, "ck": ck, "runs": list(runs)}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_export_of_a_run_whose_checkpoints_moved_aside_takes_its_own(two_lineages, capsys):
    a, b = two_lineages["runs"]
    aside = f"{two_lineages['ck']}.20260101-120000"
    to = two_lineages["tmp"] / "a-drafter"
    rc, out, err = dfo(capsys, two_lineages["hosts"], "export", "--run", a, "--to", str(to),
                       "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["checkpoint"] == f"{aside}/step_4" and res["step"] == 4
    source = json.loads((to / "dfo_export.json").read_text())
    assert json.dumps(source).count(f"{aside}/step_4") >= 1, source
    rc, out, err = dfo(capsys, two_lineages["hosts"], "export", "--run", a, "--step", "2",
                       "--to", str(to), "--json")
    assert rc == 0 and json.loads(out)["checkpoint"] == f"{aside}/step_2", err
    # B's own: the newest in checkpoints/twice/
    rc, out, err = dfo(capsys, two_lineages["hosts"], "export", "--run", b, "--to",
                       str(two_lineages["tmp"] / "b-drafter"), "--json")
    assert rc == 0 and json.loads(out)["checkpoint"] == f"{two_lineages['ck']}/step_6", err
    # status says where A's last checkpoint is now
    rc, out, err = dfo(capsys, two_lineages["hosts"], "status", "--run", a, "--json")
    assert rc == 0, err
    runs = json.loads(out)
    runs = runs["runs"] if isinstance(runs, dict) else runs
    assert [r["last_checkpoint"]["path"] for r in runs if r["run_id"] == a] == [f"{aside}/step_4"]


def test_export_of_a_run_with_no_checkpoint_left_refuses_in_one_line(two_lineages, capsys):
    a, b = two_lineages["runs"]
    aside = f"{two_lineages['ck']}.20260101-120000"
    away = two_lineages["tmp"] / "away"
    os.rename(aside, away)    # A's checkpoints gone from the host's checkpoints/
    try:
        to = two_lineages["tmp"] / "none"
        rc, out, err = dfo(capsys, two_lineages["hosts"], "export", "--run", a, "--to", str(to))
        assert rc == 11 and err.count("\n") == 1, err
        assert f"run {a} has no checkpoint" in err and b in err
        assert not to.exists()
    finally:
        os.rename(away, aside)


def test_the_host_commands_load_the_envs_modules_not_those_of_the_callers_directory(
        host_run, capsys, tmp_path, monkeypatch):
    """A dfo checkout (here: a package named like dfo's, whose modules fail loudly) as the
    working directory: the local host's `python -m orchestrator...` and `-m
    dfo_contract...` still run the env's."""
    for pkg, mod in (("orchestrator", "supervisor/query.py"), ("dfo_contract", "checkpoints.py")):
        p = tmp_path / pkg / mod
        p.parent.mkdir(parents=True, exist_ok=True)
        for d in (tmp_path / pkg, p.parent):
            (d / "__init__.py").write_text("")
        p.write_text("import sys\nprint('the checkout in the cwd ran', file=sys.stderr)\n"
                     "sys.exit(42)\n")
    monkeypatch.chdir(tmp_path)
    rc, out, err = dfo(capsys, host_run["hosts"], "status", "--json")
    assert rc == 0 and "the checkout in the cwd ran" not in err, err
    assert host_run["run_id"] in out
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--to", str(tmp_path / "x"), "--json")
    assert rc == 0 and "the checkout in the cwd ran" not in err, err


def test_export_of_the_newest_warns_of_each_newer_checkpoint_it_skips(host_run, capsys):
    import shutil

    ck = host_run["root"] / "checkpoints" / "tiny"
    shutil.copytree(ck / "step_4", ck / "step_6")
    with open(ck / "step_6" / "drafter.safetensors", "r+b") as f:
        f.write(b"\0\0\0\0")                       # corrupt: same size, other bytes
    try:
        rc, out, err = dfo(capsys, host_run["hosts"], "export", "--to",
                           str(host_run["tmp"] / "newest"), "--json")
        assert rc == 0 and json.loads(out)["step"] == 4, err
        assert f"dfo: WARNING: checkpoint {ck}/step_6 skipped: " in err, err
    finally:
        shutil.rmtree(ck / "step_6")
