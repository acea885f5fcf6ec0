"""The run configs the benches write: one typed ``TrainerConfig`` (the defaults, or a shipped
config such as ``tiny-cpu``) with dotted settings applied, validated and rendered once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SHIPPED = REPO / "orchestrator" / "config" / "defaults"


def run_config_yaml(sets: Mapping[str, Any], *, base: str | None = None) -> str:
    """YAML of ``base`` (a shipped config's name; None: the trainer's defaults) with every
    ``section.field: value`` of ``sets``; a wrong key or value is the trainer's config error."""
    from dfo_contract.trainer_config import config_from_dict, load_config, validate

    cfg = load_config(str(SHIPPED / f"{base}.yaml") if base else None, validate_now=False)
    data = cfg.to_dict()
    for key, value in sets.items():
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = value
    cfg = validate(config_from_dict(data))
    cfg.run.dir = ""          # the supervisor gives each attempt its run directory
    return cfg.to_yaml()
