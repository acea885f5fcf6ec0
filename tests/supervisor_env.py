"""Helpers for the supervisor/launch tests: a run config for the tiny real target + data
(the ``tiny_assets`` fixture of tests/conftest.py, made once per run), and a host root whose
``envs/current`` is this interpreter's venv (the "deployed env" of the local transport).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

VENV = os.path.dirname(os.path.dirname(sys.executable))
REPO = Path(__file__).resolve().parents[1]


def write_config(path: Path, assets: Path, **train) -> Path:
    cfg = yaml.safe_load((REPO / "orchestrator" / "config" / "defaults" / "tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"] = str(assets / "target")
    cfg["data"]["path"] = str(assets / "synth.jsonl")
    cfg["train"].update({"max_steps": 12, "log_every": 1, "heartbeat_s": 1.0})
    cfg["train"].update(train.pop("train", {}))
    cfg["checkpoint"].update({"every": 4, "keep": 5})
    cfg["checkpoint"].update(train.pop("checkpoint", {}))
    cfg.pop("run", None)
    path.write_text(yaml.safe_dump(cfg))
    return path


def make_root(base: Path) -> Path:
    root = base / "root"
    (root / "envs").mkdir(parents=True)
    os.symlink(VENV, root / "envs" / "current")
    return root


def local_host(root: Path, name: str = "local"):
    from orchestrator.config.inventory import HostConfig

    return HostConfig(name=name, transport="local", root=str(root), source="test")


def hosts_yaml(path: Path, root: Path) -> Path:
    path.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n    root: {root}\n")
    return path


FAST = {"warmup_s": 90, "train_s": 8, "live_grace_s": 2, "kill_grace_s": 3,
        "stop_timeout_s": 40, "poll_s": 0.1}


def wait_final(ops, run_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    info = {}
    while time.monotonic() < deadline:
        runs = ops.status(run_id)
        info = runs[0] if runs else {}
        if info.get("status") in ("done", "failed", "stopped"):
            return info
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not end within {timeout}s: {info.get('status')} "
                         f"{info.get('last_event')}")


def wait_for(pred, timeout: float = 120, what: str = "condition", poll: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def events(root: Path, run_id: str) -> list[dict]:
    p = root / "runs" / run_id / "events.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
