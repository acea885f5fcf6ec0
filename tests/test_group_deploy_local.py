"""``dfo deploy --group`` for real: two ``transport: local`` hosts with their own roots,
each env built by real uv (offline, from the wheelhouse), in parallel; then
``dfo hosts check --group`` finds the envs agree and the head reachable on 127.0.0.1."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.cli import main
from tests.lab.procs import free_port_pair

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_deploy_group_then_check_group(cpu_wheelhouse, project_wheel, tmp_path, monkeypatch,
                                       capsys):
    wheelhouse = cpu_wheelhouse
    monkeypatch.setenv("HOME", str(tmp_path))  # the wheel cache, known_hosts: nothing shared
    monkeypatch.setenv("DFO_CACHE_DIR", str(tmp_path / "dfo-cache"))
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(project_wheel.path))  # dfo's wheel, built once per run
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    port = free_port_pair()
    hf = tmp_path / "hosts.yaml"
    hf.write_text(f"""\
hosts:
  n1: {{transport: local, root: {tmp_path}/r1, wheelhouse: {wheelhouse}}}
  n2: {{transport: local, root: {tmp_path}/r2, wheelhouse: {wheelhouse}}}
groups:
  pair: {{hosts: [n1, n2], head_addr: 127.0.0.1, port: {port}, ifname: lo}}
""")
    rc = main(["--hosts", str(hf), "deploy", "--group", "pair", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    js = json.loads(cap.out)
    assert js["ok"] and [h["host"] for h in js["hosts"]] == ["n1", "n2"]
    for h, root in zip(js["hosts"], ("r1", "r2"), strict=True):
        assert h["result"]["action"] == "create", h
        assert h["result"]["fingerprint"]["torch"].endswith("+cpu")
        assert (tmp_path / root / "envs/current/.dfo-complete").is_file()
    assert os.readlink(tmp_path / "r1/envs/current") == os.readlink(tmp_path / "r2/envs/current")

    # the second time: nothing to do on either; the summary table, one row per host
    assert main(["--hosts", str(hf), "deploy", "--group", "pair"]) == 0
    out = capsys.readouterr().out
    assert out.count("noop") == 2 and max(len(x) for x in out.splitlines()) <= 80

    assert main(["--hosts", str(hf), "hosts", "check", "--group", "pair", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["env_differences"] == [] and all(r["ok"] for r in js["reach"])
    assert js["hosts"][0]["fingerprint"] == js["hosts"][1]["fingerprint"]
