"""``dfo hosts check --group`` over the lab: the container (proxmox transport, ``pct exec``)
as the head and the ssh node as the other member. The container has only its own loopback,
so the node cannot reach the head's 127.0.0.1: the check says so, per host, after the
head's listener really ran through ``pct exec``; the node's env is compared with the head's
(none deployed there)."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from tests.lab.procs import free_port_pair

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

FP = {"profile": "cpu", "lock_hash": "a" * 64, "dfo": "0.1.0", "python": "3.11.7",
      "torch": "2.13.0+cpu"}


def test_check_group_container_head_unreachable_from_node(lab, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    if lab.vmid is None:
        pytest.skip("the lab has no container")
    port = free_port_pair()  # free on this machine's loopback: the node's connection is refused
    node_root = tmp_path / "node-root"
    env = node_root / "envs" / "cpu-x"
    env.mkdir(parents=True)
    (env / "fingerprint.json").write_text(json.dumps(FP))
    (node_root / "envs" / "current").symlink_to("cpu-x")
    hf = tmp_path / "hosts.yaml"
    hf.write_text(lab.hosts_yaml(root="/root/dfo-group-check", node_root=str(node_root))
                  + f"groups:\n  pair: {{hosts: [lab, lab-node], head_addr: 127.0.0.1, port: {port}}}\n")
    rc = main(["--hosts", str(hf), "hosts", "check", "--group", "pair", "--json"])
    js = json.loads(capsys.readouterr().out)
    assert rc == 3, js
    assert [h["host"] for h in js["hosts"]] == ["lab", "lab-node"] and all(h["ok"] for h in js["hosts"])
    assert js["hosts"][0]["check"]["container"] == "running"
    head, node = js["reach"]
    assert head["ok"] and head["message"] == f"listening on 127.0.0.1:{port},{port + 1}"
    assert not node["ok"]
    assert node["message"].startswith(f"cannot reach 127.0.0.1:{port} from lab-node: ")
    assert "refused" in node["message"].lower()
    assert [d["message"] for d in js["env_differences"]] == [
        "no env deployed on the head lab: run dfo deploy --group pair"]


def test_check_group_ssh_head_reached_by_local_member(sshd_only, tmp_path, monkeypatch, capsys):
    """The ssh node as the head (its listener runs over the real sshd), this machine
    (transport local, same network namespace) as the member: reached on both ports, the
    same env on both."""
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    lab = sshd_only
    port = free_port_pair()
    roots = {}
    for name in ("node-root", "here-root"):
        root = tmp_path / name
        (root / "envs" / "cpu-x").mkdir(parents=True)
        (root / "envs" / "cpu-x" / "fingerprint.json").write_text(json.dumps(FP))
        (root / "envs" / "current").symlink_to("cpu-x")
        roots[name] = root
    hf = tmp_path / "hosts.yaml"
    hf.write_text(lab.hosts_yaml(node_root=str(roots["node-root"]))
                  + f"  here: {{transport: local, root: {roots['here-root']}}}\n"
                  + f"groups:\n  pair: {{hosts: [lab-node, here], head_addr: 127.0.0.1, "
                    f"port: {port}, ifname: lo}}\n")
    rc = main(["--hosts", str(hf), "hosts", "check", "--group", "pair", "--json"])
    js = json.loads(capsys.readouterr().out)
    assert rc == 0, js["problems"]
    assert [(r["host"], r["ok"], r["role"]) for r in js["reach"]] == [
        ("lab-node", True, "head"), ("here", True, "member")]
    assert js["reach"][1]["message"] == f"reaches 127.0.0.1:{port},{port + 1}"
