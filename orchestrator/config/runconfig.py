"""Run configs: the trainer's config loaded and validated on this side (torch-free, through
``dfo_contract.trainer_config``), and the default configs shipped as package data
(``orchestrator/config/defaults/*.yaml``), so ``dfo launch`` and ``dfo demo`` work from any
directory and from an installed wheel.

A run config is parsed once (:func:`read_config_file`, or a default built as a typed
``TrainerConfig``: ``engine.demo.default_run_config``) and its overrides (``--set``) are
applied once (:func:`with_overrides`): everything after takes the :class:`RunLayers`."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Sequence

from dfo_contract import trainer_config as tcfg
from dfo_contract.exitcodes import TrainerError
from dfo_contract.trainer_config import TrainerConfig

from ..common.errors import ConfigError

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


@dataclass(frozen=True)
class RunLayers:
    """A run config from one parse of its file, with its overrides applied once."""
    config: TrainerConfig       # with the overrides, validated: the config in force
    base: dict[str, Any]        # its flat values without the overrides: spec.json's config.base
    sets: dict[str, Any]        # the overrides, as the config typed them: config.overrides
    data: bytes                 # the file's bytes, shipped as the run's config.yaml
    #: the keys the file or an override sets (the trainer's explicit_keys:
    #: model.init_from lets a drafter fill the others)
    explicit: frozenset[str] = field(default_factory=frozenset)

    @property
    def full(self) -> dict[str, Any]:
        """The config in force, nested (``TrainerConfig.to_dict``)."""
        return self.config.to_dict()


@contextmanager
def _trainer_errors() -> Iterator[None]:
    try:
        yield
    except (TrainerError, ValueError, TypeError) as e:  # the trainer's validation: one line
        line = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ConfigError(line if line.startswith("config:") else f"trainer config: {line}") from None


def read_config_file(path: str | os.PathLike) -> tuple[TrainerConfig, bytes]:
    """The run config file at ``path``: one read, one YAML parse (not validated yet) and
    its bytes, to ship as is."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read: {e.strerror or e}") from None
    with _trainer_errors():
        return tcfg.load_text(data.decode("utf-8"), str(path)), data


def with_overrides(cfg: TrainerConfig, data: bytes,
                   overrides: Sequence[tuple[str, str]] = ()) -> RunLayers:
    """``cfg`` (from ``data``, left as is) with ``overrides`` ((key, text) pairs: ``--set``,
    coerced by the trainer's rules), validated: the one place they are applied."""
    base = tcfg.flat(cfg)
    with _trainer_errors():
        full = tcfg.apply_overrides(tcfg.copied(cfg), list(overrides))
    values = tcfg.flat(full)
    return RunLayers(config=full, base=base, sets={k: values[k] for k, _ in overrides},
                     data=data, explicit=frozenset(full.explicit_keys))


def load_layers(path: str | os.PathLike | None,
                overrides: Sequence[tuple[str, str]] = ()) -> RunLayers:
    """The run config at ``path`` (None: the trainer's defaults) with ``overrides``."""
    cfg, data = read_config_file(path) if path is not None else (TrainerConfig(), b"")
    return with_overrides(cfg, data, overrides)


def load_config(path: str | os.PathLike | None,
                overrides: Sequence[tuple[str, str]] = ()) -> tuple[dict, bytes]:
    """The trainer config as a nested dict and the file's bytes (``load_layers``)."""
    layers = load_layers(path, overrides)
    return layers.full, layers.data
