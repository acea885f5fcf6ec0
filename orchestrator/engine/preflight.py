"""Checks ``dfo launch`` makes on the host before anything starts, beyond the env probe."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import ConfigError
from ..ops import launch_plan as lp


def check_config_paths(t, host: str, cfg: Mapping[str, Any], config: str | None) -> None:
    """The config's target and data paths exist on the host (one remote probe), so a
    launch that cannot train is refused here rather than failing in attempt 1."""
    keys = [("model.target_path", (cfg.get("model") or {}).get("target_path")),
            ("data.path", (cfg.get("data") or {}).get("path"))]
    keys = [(k, v) for k, v in keys if isinstance(v, str) and v]
    if not keys:
        return
    r = t.run(lp.missing_paths_argv([v for _, v in keys]), timeout=60)
    r.check(f"checking the config's paths on {host}")
    missing = set(r.out.splitlines())
    for k, v in keys:
        if v in missing:
            where = config or "the default config tiny-cpu.yaml"
            fix = (f"run `dfo demo --host {host}` to make the demo's assets, or pass --config"
                   if not config else f"fix {k} in {config} or pass --set {k}=PATH")
            raise ConfigError(f"{k} of {where}: {v} does not exist on {host}", hint=fix)
