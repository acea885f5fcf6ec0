"""The README's main job: deploy -> demo assets -> warm-cache -> launch -> logs -f.

Everything here goes through the host's transport, so the demo runs the same on the
embedded ``local`` default as on a Proxmox container. The pure part (the demo's run
config) is ``demo_config``; ``ensure_assets`` makes the tiny random-init Qwen3 target and
the synthetic data set on the host, with the deployed env's python, once.
"""

from __future__ import annotations

import logging
import posixpath
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

from dfo_contract.fsio import atomic_write_text

from ..config.runconfig import default_config_path, load_config
from ..ops.layout import RemoteLayout
from ..transport.base import Transport

log = logging.getLogger("dfo")

#: the fault the demo injects: the real FX-tracing error, raised by torch, at this step
DEMO_FAULT = "fx_race@30"


def demo_paths(layout: RemoteLayout) -> dict[str, str]:
    base = posixpath.join(layout.root, "demo")
    return {"dir": base, "target": posixpath.join(base, "target"),
            "data": posixpath.join(base, "synth.jsonl")}


def demo_config(base: Mapping[str, Any], layout: RemoteLayout) -> dict[str, Any]:
    """The demo's run config: the tiny CPU config with its paths on the host's root.

    The run directory and checkpoint directory are set by ``dfo launch``.
    """
    cfg = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    p = demo_paths(layout)
    cfg.setdefault("model", {})["target_path"] = p["target"]
    cfg.setdefault("data", {})["path"] = p["data"]
    cfg.pop("run", None)
    train = cfg.setdefault("train", {})
    train["max_steps"] = 120
    train["log_every"] = 10
    # the incident's pattern: torch.compile on, the compile gate off. The supervisor's
    # first fallback for the FX error turns the gate on.
    comp = cfg.setdefault("compile", {})
    comp["enabled"] = True
    comp["gate"] = False
    ck = cfg.setdefault("checkpoint", {})
    ck["every"] = 20
    ck["keep"] = 3
    return cfg


def default_run_config(layout: RemoteLayout) -> dict[str, Any]:
    """The run config ``dfo launch`` and ``dfo warm-cache`` use without ``--config``: the
    shipped tiny CPU config with its target and data where ``dfo demo`` puts them on this
    host (``<root>/demo/``), so the default works right after the demo, from any directory."""
    cfg = yaml.safe_load(default_config_path().read_text())
    p = demo_paths(layout)
    cfg.setdefault("model", {})["target_path"] = p["target"]
    cfg.setdefault("data", {})["path"] = p["data"]
    cfg.pop("run", None)
    return cfg


@contextmanager
def default_config_file(layout: RemoteLayout) -> Iterator[Path]:
    """``default_run_config`` as a local file named like the shipped one (tiny-cpu.yaml),
    for as long as the ``with`` lasts."""
    with tempfile.TemporaryDirectory(prefix="dfo-default-") as d:
        dest = Path(d) / default_config_path().name
        atomic_write_text(dest, f"# {default_config_path().name} with the demo's paths on the host\n"
                          + yaml.safe_dump(default_run_config(layout), sort_keys=False))
        yield dest


def load_run_config(path: str | None, layout: RemoteLayout,
                    overrides=()) -> tuple[dict, bytes]:
    """``load_config(path, overrides)``; no path: the host's default run config."""
    if path:
        return load_config(path, overrides)
    with default_config_file(layout) as p:
        return load_config(p, overrides)


def write_demo_config(layout: RemoteLayout, dest: Path, base_path: Path | None = None) -> Path:
    """Write the demo's run config to ``dest``; the base is the shipped tiny CPU config."""
    base = yaml.safe_load((base_path or default_config_path()).read_text())
    cfg = demo_config(base, layout)
    atomic_write_text(dest, "# dfo demo config (written by `dfo demo`)\n"
                      + yaml.safe_dump(cfg, sort_keys=False))
    return dest


def ensure_assets(t: Transport, layout: RemoteLayout, *,
                  say: Callable[[str], None] = lambda m: None) -> dict[str, str]:
    """Make the tiny target and the synthetic data on the host, unless already there."""
    p = demo_paths(layout)
    py = layout.current_python
    have = t.run(["test", "-s", posixpath.join(p["target"], "config.json")], timeout=30).ok
    if not have:
        say(f"making a tiny random-init Qwen3 target in {p['target']}")
        t.run([py, "-m", "trainer.target", "--out", p["target"]], timeout=600).check("trainer.target")
    if not t.run(["test", "-s", p["data"]], timeout=30).ok:
        say(f"writing a synthetic data set to {p['data']}")
        t.run([py, "-m", "trainer.data", "synth", "--out", p["data"], "--num", "512",
               "--seq-len", "64", "--vocab", "128", "--seed", "0"], timeout=600).check("trainer.data synth")
    return p
