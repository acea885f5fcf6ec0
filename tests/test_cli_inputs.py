"""Bad input a user can type gets one clear error, exit 2, no traceback."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from dfo_contract.status import RunStatus
from orchestrator.cli.status import status_table
from orchestrator.config.inventory import parse_inventory
from orchestrator.config.profiles import PROFILES_DIR, load_profile
from orchestrator.common.errors import ConfigError

DFO = [sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"]


@pytest.mark.parametrize("argv", [
    ["warm-cache", "--timeout", "nan"],
    ["warm-cache", "--timeout", "inf"],
    ["warm-cache", "--timeout", "-3"],
    ["launch", "--backoff-scale", "inf", "--dry-run"],
    ["launch", "--backoff-scale", "nan", "--dry-run"],
    ["stop", "--timeout", "inf"],
])
def test_non_finite_numbers_are_refused_without_traceback(argv, tmp_path):
    r = subprocess.run([*DFO, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "finite" in r.stderr or "must be" in r.stderr


def test_status_table_shows_hostile_state_as_text():
    runs = [{"run_id": "r[bold]1", "status": "[/x]", "started_at": "yesterday",
             "tokens_per_s": "fast", "last_event": "[/red]", "attempt": 2,
             "fallbacks": [{"step": "[/compile_gate]"}], "last_checkpoint": {"step": 110}},
            {"run_id": "ok", "status": "running", "started_at": 100.0, "now": 160.0,
             "tokens_per_s": float("nan"), "last_step": 7}]
    buf = io.StringIO()
    Console(file=buf, width=200, highlight=False).print(
        status_table("h", [RunStatus.from_json(r) for r in runs]))
    out = buf.getvalue()
    assert "[/x]" in out and "r[bold]1" in out and "[/red]" in out and "[/compile_gate]" in out
    assert "step_110" in out and "1m00s" in out


HOSTS = """hosts:
  pve:
    transport: ssh
    ssh: root@127.0.0.1
    root: /root/dfo
    index_url: {url}
"""


@pytest.mark.parametrize("url", [
    "https://pypi.example/simple/?token=SEKRET",
    "https://pypi.example/simple?x=1&api_key=SEKRET",
    "https://pypi.example/simple?Password=SEKRET#frag",
])
def test_index_url_with_a_credential_in_its_query_is_refused(url):
    with pytest.raises(ConfigError) as e:
        parse_inventory(HOSTS.format(url=url), "hosts.yaml")
    msg = str(e.value)
    assert msg.startswith("hosts.yaml:6: hosts.pve.index_url: a credential in the URL's query")
    assert "SEKRET" not in msg and "\n" not in msg


def test_index_url_with_a_plain_query_is_kept():
    inv = parse_inventory(HOSTS.format(url="https://pypi.example/simple?format=json"),
                          "hosts.yaml")
    assert inv.hosts["pve"].index_url.endswith("?format=json")


@pytest.mark.parametrize("name", ["../../../../tmp/x", "a/b", ".hidden", "x y", ""])
def test_profile_name_must_be_a_plain_name(tmp_path, name):
    import shutil

    d = tmp_path / "p"
    shutil.copytree(PROFILES_DIR / "cpu", d)
    text = (d / "profile.yaml").read_text().splitlines()
    text = [f"name: {name!r}" if ln.startswith("name:") else ln for ln in text]
    (d / "profile.yaml").write_text("\n".join(text) + "\n")
    if name == "":  # an empty name falls back to the directory's name, which is plain
        assert load_profile(str(d)).name == "p"
        return
    with pytest.raises(ConfigError, match="is not a plain name"):
        load_profile(str(d))


@pytest.mark.parametrize("argv, what", [
    (["launch", "--fault", "bogus", "--dry-run"], "'bogus': not of the form KIND[=ARG]@STEP"),
    (["launch", "--fault", "nosuch@3", "--dry-run"], "unknown kind 'nosuch'"),
    (["launch", "--fault", "fx_race@5,", "--dry-run"], "empty item"),
    # the demo checks it before it deploys anything
    (["demo", "--fault", "exit@2"], "exit needs an argument"),
    (["warm-cache", "--prune", "-1"], "-1 is not in the range x>=0"),
])
def test_a_bad_fault_spec_or_prune_count_is_one_line_exit_2(argv, what, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "DFO_HOSTS"}
    r = subprocess.run([*DFO, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.stdout, r.stderr)
    assert what in lines[0] and lines[0].startswith(f"dfo: error: dfo {argv[0]}: "), lines
    assert not (tmp_path / ".dfo").exists() and not list(tmp_path.iterdir())   # nothing ran


def test_a_bad_fault_spec_through_the_engine_is_a_config_error(tmp_path):
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport
    from tests.supervisor_env import local_host, make_root

    run_ops = RunOps(LocalTransport("local"), local_host(make_root(tmp_path)))
    with pytest.raises(ConfigError, match=r"^--fault: 'hang@x': step must be a non-negative"):
        run_ops.launch(LaunchOptions(run_name="t", fault="hang@x", dry_run=True, env_check=False))


def test_a_config_file_name_that_is_no_run_name_says_where_the_name_came_from(tmp_path):
    src = Path(__file__).resolve().parents[1] / "orchestrator/config/defaults/tiny-cpu.yaml"
    (tmp_path / "my cfg.yaml").write_text(src.read_text())
    r = subprocess.run([*DFO, "launch", "--config", "my cfg.yaml", "--dry-run"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "the run name 'my cfg', taken from the config file's name (my cfg.yaml)" in lines[0]
    assert "--run-name NAME" in lines[0] and "--run-name:" not in lines[0]
    # a bad --run-name given as such is still named as the flag
    r = subprocess.run([*DFO, "launch", "--config", "my cfg.yaml", "--run-name", "a b",
                        "--dry-run"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "--run-name: 'a b' is not a valid run name" in r.stderr
