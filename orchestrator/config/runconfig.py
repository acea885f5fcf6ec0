"""Run configs: the trainer's config loaded and validated on this side (torch-free, through
``dfo_contract.trainer_config``), and the default configs shipped as package data
(``orchestrator/config/defaults/*.yaml``), so ``dfo launch`` and ``dfo demo`` work from any
directory and from an installed wheel.

A run config is parsed once (:func:`read_config_file`, or the default built as a typed
``TrainerConfig``: :func:`default_run_config`, the demo's config on the host's root) and
its overrides (``--set``) are applied once (:func:`with_overrides`; both:
:func:`load_run_layers`): everything after takes the :class:`RunLayers`."""

from __future__ import annotations

import os
import posixpath
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Sequence

from dfo_contract import trainer_config as tcfg
from dfo_contract.exitcodes import TrainerError
from dfo_contract.trainer_config import TrainerConfig

from ..common.errors import ConfigError
from .host_tree import HostTree

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
    #: with the overrides, validated: the config in force (its explicit_keys: the keys the
    #: file or an override sets; model.init_from lets a drafter fill the others)
    config: TrainerConfig
    base: dict[str, Any]        # its flat values without the overrides: spec.json's config.base
    sets: dict[str, Any]        # the overrides, as the config typed them: config.overrides
    data: bytes                 # the file's bytes, shipped as the run's config.yaml

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
                     data=data)


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


# --- the default run config: the demo's, on the host's root ----------------------------

def demo_paths(tree: HostTree) -> dict[str, str]:
    """Where ``dfo demo`` puts its assets on the host (``<root>/demo/``): the default run
    config's target, data and held-out data."""
    base = posixpath.join(tree.root, "demo")
    return {"dir": base, "target": posixpath.join(base, "target-taught"),
            "data": posixpath.join(base, "regen.jsonl"),
            "eval": posixpath.join(base, "regen-heldout.jsonl")}


def demo_config(cfg: TrainerConfig, tree: HostTree) -> TrainerConfig:
    """The demo's run config (the default run config, ``default_run_config``): ``cfg`` (the
    tiny CPU config) with its paths on the host's root, in place.

    The run directory and checkpoint directory are set by ``dfo launch``.
    """
    p = demo_paths(tree)
    tcfg.clear(cfg, "run.dir")
    # the threaded lazy-compile race's pattern (docs/recovery.md): torch.compile on, the
    # compile gate off. The supervisor's first fallback for the FX error turns the gate on.
    return tcfg.set_values(cfg, {
        "model.target_path": p["target"], "data.path": p["data"], "data.eval_path": p["eval"],
        "eval.every": 40,           # measured acceptance length
        "train.max_steps": 200, "train.log_every": 10,
        "compile.enabled": True, "compile.gate": False,
        "checkpoint.every": 20, "checkpoint.keep": 3})


#: the run name ``dfo launch`` uses without ``--config`` and ``--run-name``: the demo's own
#: (its checkpoints are under ``<root>/checkpoints/demo/``)
DEFAULT_RUN_NAME = "demo"


def default_run_config(tree: HostTree) -> tuple[TrainerConfig, bytes]:
    """The run config ``dfo launch`` and ``dfo warm-cache`` use without ``--config``: the
    demo's own (``demo_config`` over the shipped tiny CPU config: compile on, its target,
    data and held-out data where ``dfo demo`` puts them on this host, ``<root>/demo/``), so
    the default works right after the demo, from any directory, and resumes its checkpoints.
    The typed config (one parse of the shipped file) and the file shipped for it: the YAML
    of its explicit keys."""
    cfg, _ = read_config_file(default_config_path())
    cfg = demo_config(cfg, tree)
    head = (f"# the demo's run config on this host ({default_config_path().name} with the "
            "demo's settings and paths)\n")
    return cfg, (head + tcfg.explicit_yaml(cfg)).encode()


def load_run_layers(path: str | None, tree: HostTree,
                    overrides: Sequence[tuple[str, str]] = ()) -> RunLayers:
    """The run config at ``path`` (no path: the host's default run config,
    ``default_run_config``) with ``overrides`` (``--set``), each applied once."""
    cfg, data = read_config_file(path) if path else default_run_config(tree)
    return with_overrides(cfg, data, overrides)
