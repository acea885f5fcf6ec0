"""Run configs: the trainer's config loaded and validated on this side (torch-free, through
``dfo_contract.trainer_config``), and the default configs shipped as package data
(``orchestrator/config/defaults/*.yaml``), so ``dfo launch`` and ``dfo demo`` work from any
directory and from an installed wheel."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from dfo_contract import trainer_config as tcfg
from dfo_contract.exitcodes import TrainerError

from ..errors import ConfigError

#: the run config ``dfo launch`` uses without ``--config`` (and the base of ``dfo demo``'s)
DEFAULT_CONFIG = "tiny-cpu.yaml"


def default_config_path(name: str = DEFAULT_CONFIG) -> Path:
    """The path of a shipped default run config (``tiny-cpu.yaml``, ``bench-h200.yaml``)."""
    p = resources.files(__package__).joinpath("defaults", name)
    if not p.is_file():
        raise ConfigError(f"no shipped run config {name!r}",
                          hint="shipped: " + ", ".join(default_config_names()))
    return Path(str(p))


def default_config_names() -> list[str]:
    d = resources.files(__package__).joinpath("defaults")
    return sorted(x.name for x in d.iterdir() if x.name.endswith(".yaml"))


def load_config(path: str | os.PathLike | None,
                overrides: Sequence[tuple[str, str]] = ()) -> tuple[dict, bytes]:
    """The trainer config as a nested dict (defaults + file + overrides, validated by
    ``dfo_contract.trainer_config``, which imports no torch) and the file's bytes to ship.
    ``path`` None means the built-in defaults."""
    layers = load_layers(path, overrides)
    return layers.full, layers.data


@dataclass(frozen=True)
class RunLayers:
    """A run config from one read of its file."""
    base: dict                  # the file over the defaults (nested): spec.json's config.base
    full: dict                  # that with the overrides, validated: the config in force
    data: bytes                 # the file's bytes, shipped as the run's config.yaml
    explicit: frozenset[str]    # the keys the file or an override sets (the trainer's
    #                             explicit_keys: model.init_from lets a drafter fill the others)


def load_layers(path: str | os.PathLike | None,
                overrides: Sequence[tuple[str, str]] = ()) -> RunLayers:
    """The run config at ``path`` (None: the built-in defaults) with ``overrides``, from one
    read of the file."""
    text = b""
    if path is not None:
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"--config {path}: cannot read: {e.strerror or e}") from None
    try:
        cfg = tcfg.load_config(str(path) if path is not None else None, [], validate_now=False)
        base = cfg.to_dict()
        full = tcfg.apply_overrides(cfg, list(overrides)).to_dict()
        explicit = frozenset(cfg.explicit_keys)
    except (TrainerError, ValueError, TypeError) as e:  # the trainer's validation: one line
        line = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ConfigError(line if line.startswith("config:") else f"trainer config: {line}") from None
    return RunLayers(base=base, full=full, data=text, explicit=explicit)
