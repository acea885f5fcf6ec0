"""The drafter methods' torch-free half: one ``MethodContract`` per ``model.method``.

A method (``dflash``, ``dflash2``) is registered here once (``register``) with what the
config, the orchestrator and an export's config.json need of it, without torch:

- ``settings``: the frozen dataclass of the method's own ``model.*`` fields (DFlash2's
  ``DFlash2Settings``); ``ModelConfig.method_settings`` holds one per registered method that
  has one (``settings_of(DFlash2Settings)``, typed). The YAML and the flags keep the
  fields flat (``model.conv_kernel_size``: ``ModelConfig.get_flat``/``set_flat``), and
  ``TrainerConfig.to_dict`` writes them flat, so a config file, its compile-cache key and a
  checkpoint's config.yaml name them as the other ``model`` fields.
- ``validate``: the method's field checks (``err(flag, why)``), run only when it is chosen.
- ``sliding_layers``: its draft layers slide by default (``trainer_config.layers``), and a
  checkpoint written before ``model.is_causal`` had those layers causal.
- the export: ``architectures`` (how an exported config.json names the method; empty:
  the default DFlash one), ``export_config`` (a DFlash config.json object turned into the
  method's), ``read_settings`` (the method's fields of an export's ``dflash_config``),
  ``remote_code`` (the export ships DFlash's trust_remote_code module).

The torch half (build the drafter, its objective, its served draft, its FLOPs) is
``trainer.core.methods``, whose ``DrafterMethod`` record holds this contract. No module
outside the two registries compares a method's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable

#: the method of a config that names none
DEFAULT_METHOD = "dflash"


@dataclass(frozen=True, kw_only=True)
class DFlash2Settings:
    """DFlash2's own ``model.*`` fields; names as in the export's ``dflash_config``."""
    conv_kernel_size: int = 2                 # taps of the dynamic depthwise conv around each sublayer
    conv_group_size: int = 16                 # channels sharing one dynamic coefficient (divides hidden)
    selector_rank: int = 256                  # rank of the pairwise path selector
    selector_top_k: int = 16                  # candidates per slot the selector re-ranks
    final_logit_softcapping: float = 20.0     # unary logits: cap * tanh(logits * multiplier / cap)
    output_multiplier: float = 1.0


@dataclass(frozen=True, kw_only=True)
class MethodContract:
    """What the config, the orchestrator and an export need of one method (torch-free)."""
    name: str                                  # the value of model.method
    label: str                                 # as prose names it: "DFlash2"
    settings: type | None = None               # frozen dataclass of its own model.* fields
    validate: Callable[[Any, Any, Callable], None] | None = None   # (cfg, settings, err)
    sliding_layers: bool = False
    architectures: tuple[str, ...] = ()
    export_config: Callable[[dict, Any, Any], dict] | None = None  # (conf, model_cfg, settings)
    read_settings: Callable[[dict], dict[str, Any]] | None = None
    remote_code: bool = True

    def setting_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.settings)) if self.settings else ()


_CONTRACTS: dict[str, MethodContract] = {}


def register(c: MethodContract) -> MethodContract:
    """Add ``c`` (a name registered again is replaced); its settings' names must be new."""
    taken = {n for o in _CONTRACTS.values() if o.name != c.name for n in o.setting_names()}
    clash = taken.intersection(c.setting_names())
    if clash:
        raise ValueError(f"method {c.name}: model.{sorted(clash)[0]} belongs to another method")
    _CONTRACTS[c.name] = c
    return c


def unregister(name: str) -> None:
    """Drop a method (a test's toy method); the built-in ones stay."""
    _CONTRACTS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered methods, in registration order."""
    return tuple(_CONTRACTS)


def contracts() -> tuple[MethodContract, ...]:
    return tuple(_CONTRACTS.values())


def contract(name: str) -> MethodContract:
    """The contract of method ``name`` (KeyError for an unknown one)."""
    return _CONTRACTS[name]


def known(name: str) -> MethodContract | None:
    """The contract of method ``name``, None for an unknown one (before validation)."""
    return _CONTRACTS.get(name)


def of_export(conf: dict) -> MethodContract:
    """The method an exported config.json object declares (by ``architectures``)."""
    arch = list(conf.get("architectures") or [])
    for c in _CONTRACTS.values():
        if c.architectures and arch == list(c.architectures):
            return c
    return _CONTRACTS[DEFAULT_METHOD]


def owner(field_name: str) -> MethodContract | None:
    """The method whose settings have ``field_name``, if any."""
    for c in _CONTRACTS.values():
        if field_name in c.setting_names():
            return c
    return None


def settings_owner(cls: type) -> MethodContract:
    """The method whose settings class is ``cls`` (KeyError when none has it)."""
    for c in _CONTRACTS.values():
        if c.settings is cls:
            return c
    raise KeyError(f"no registered method has the settings {cls.__name__}")


def default_settings() -> dict[str, Any]:
    """``{method: its settings at their defaults}`` (``ModelConfig.method_settings``)."""
    return {c.name: c.settings() for c in _CONTRACTS.values() if c.settings is not None}


def validate_method(cfg, err) -> None:
    """Raise ``err(flag, why)`` for the first bad method field (the chosen method's only)."""
    m = cfg.model
    if m.method not in _CONTRACTS:
        raise err("model.method", f"expected one of {', '.join(_CONTRACTS)}, got {m.method!r}")
    c = _CONTRACTS[m.method]
    if c.validate is not None:
        c.validate(cfg, m.settings(), err)


# --------------------------------------------------------------------------- DFlash2

DFLASH2_ARCH = "DFlash2DraftModel"
#: the DFlash2 fields of ``dflash_config`` (the names of ``model.*`` and of ``DFlash2Spec``)
DFLASH2_FIELDS = tuple(f.name for f in fields(DFlash2Settings))


def _validate_dflash2(cfg, s: DFlash2Settings, err) -> None:
    m = cfg.model
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise err(f"model.{name}", f"expected a positive integer, got {v!r}")
    if s.conv_kernel_size > m.block_size:
        raise err("model.conv_kernel_size", f"must be <= model.block_size ({m.block_size}), "
                                            f"got {s.conv_kernel_size}")
    if not (math.isfinite(s.final_logit_softcapping) and s.final_logit_softcapping > 0):
        raise err("model.final_logit_softcapping",
                  f"expected a positive number, got {s.final_logit_softcapping}")
    if not (math.isfinite(s.output_multiplier) and s.output_multiplier > 0):
        raise err("model.output_multiplier", f"expected a positive number, got {s.output_multiplier}")
    a = cfg.train.selector_loss_alpha
    if not (math.isfinite(a) and a >= 0):
        raise err("train.selector_loss_alpha", f"expected a finite number >= 0, got {a}")
    t = cfg.train
    for name in ("selector_warmup_ratio", "selector_ramp_ratio"):
        v = getattr(t, name)
        if not (math.isfinite(v) and 0 <= v <= 1):
            raise err(f"train.{name}", f"expected a fraction of the steps in [0, 1], got {v}")
    if t.selector_warmup_ratio + t.selector_ramp_ratio > 1:
        raise err("train.selector_ramp_ratio", f"warm-up {t.selector_warmup_ratio} + ramp "
                                               f"{t.selector_ramp_ratio} exceed the run (1)")


def dflash2_fields(conf: dict) -> dict[str, Any]:
    """``block_size`` and the DFLASH2_FIELDS of a DFlash2 export's config.json object
    (KeyError, TypeError, ValueError for a missing or malformed field)."""
    dc = conf["dflash_config"]
    return {"block_size": int(dc["block_size"] if "block_size" in dc else conf["block_size"]),
            "conv_kernel_size": int(dc["conv_kernel_size"]),
            "conv_group_size": int(dc["conv_group_size"]),
            "selector_rank": int(dc["selector_rank"]),
            "selector_top_k": int(dc["selector_top_k"]),
            "final_logit_softcapping": float(dc.get("final_logit_softcapping") or 0.0),
            "output_multiplier": float(dc.get("output_multiplier", 1.0))}


def _dflash2_settings(conf: dict) -> dict[str, Any]:
    d2 = dflash2_fields(conf)
    return {n: d2[n] for n in DFLASH2_FIELDS}


def dflash2_config(conf: dict, model_cfg, s: DFlash2Settings) -> dict:
    """``conf`` (a DFlash export's config.json object) turned into the DFlash2 one."""
    c = dict(conf)
    c.pop("auto_map", None)   # modeling_dflash.py is DFlash's: serving engines load DFlash2
    c["architectures"] = [DFLASH2_ARCH]
    dc = dict(c.get("dflash_config") or {})
    dc.update({"block_size": int(model_cfg.block_size), "conv_kernel_size": int(s.conv_kernel_size),
               "conv_group_size": int(s.conv_group_size), "selector_rank": int(s.selector_rank),
               "selector_top_k": int(s.selector_top_k),
               "final_logit_softcapping": float(s.final_logit_softcapping),
               "output_multiplier": float(s.output_multiplier)})
    c["dflash_config"] = dc
    return c


DFLASH = register(MethodContract(name=DEFAULT_METHOD, label="DFlash"))
DFLASH2 = register(MethodContract(
    name="dflash2", label="DFlash2", settings=DFlash2Settings, validate=_validate_dflash2,
    sliding_layers=True, architectures=(DFLASH2_ARCH,), export_config=dflash2_config,
    read_settings=_dflash2_settings, remote_code=False))
