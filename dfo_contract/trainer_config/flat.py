"""A trainer config as flat ``SECTION.FIELD`` values (pure): spec.json's ``config`` section
and the fallback ladders read the config this way; the shipped run config file is the YAML
of its explicit keys."""

from __future__ import annotations

import copy
from typing import Any, Mapping

import yaml

from .parse import set_values
from .schema import TrainerConfig


def flat(cfg: TrainerConfig) -> dict[str, Any]:
    """``{"train.micro_batch": 8, ...}``: every field of ``cfg``."""
    return {f"{sec}.{k}": v for sec, body in cfg.to_dict().items() for k, v in body.items()}


def from_flat(values: Mapping[str, Any]) -> TrainerConfig:
    """The config of flat ``values`` (``flat`` output, spec.json's ``Config.merged``)."""
    return set_values(TrainerConfig(), dict(values))


def copied(cfg: TrainerConfig) -> TrainerConfig:
    """An independent copy of ``cfg`` (its explicit keys too)."""
    return copy.deepcopy(cfg)


def clear(cfg: TrainerConfig, key: str) -> TrainerConfig:
    """``cfg`` with ``key`` back at its default and no longer explicit (in place)."""
    cfg.set_key(key, TrainerConfig().get_key(key))
    cfg.explicit_keys.discard(key)
    return cfg


def explicit_yaml(cfg: TrainerConfig) -> str:
    """The YAML of ``cfg``'s explicit keys, by section: the file the trainer reads back as
    this config (the keys it does not name keep the trainer's defaults)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat(cfg).items():
        if key in cfg.explicit_keys:
            sec, name = key.split(".", 1)
            out.setdefault(sec, {})[name] = value
    return yaml.safe_dump(out, sort_keys=False)
