"""The drafter methods' torch half: one ``DrafterMethod`` record per ``model.method``.

As torchtitan's ``ModelSpec``: a record per method of what differs between methods, picked
once from the config (``method_of(cfg)``) and handed to the code that runs it; no module
outside this registry and ``dfo_contract.trainer_config.methods`` compares a method's name.

``DrafterMethod`` extends the torch-free ``MethodContract`` (settings, validation, export
config) with:

- ``build(spec, model_cfg, shared)``: the untrained drafter of a config;
  ``build_exported(conf, spec, shared)``: of an exported config.json object;
- ``prepare(drafter, train_cfg)``: after the weights are in, before the optimizer
  (DFlash2: a selector loss weight of 0 freezes the selector);
- the objective: ``forward_loss`` (the compiled step function, named ``step_name``) and
  ``step_args(cfg)``, its arguments after the common ones; ``before_step(drafters, cfg,
  step, horizon)`` before each optimizer step (DFlash2: the selector weight's schedule);
- ``served_draft(drafter, hidden, anchor_ids)``: the draft an engine serves (None: the LM
  head's argmax); ``own_spec(model_cfg)``: the method's module sizes (DFlash2's
  ``DFlash2Spec``), and ``extra_flops(spec, own, tq, label_rows)``: its FLOPs over DFlash's.

A record is registered in the one registry of ``dfo_contract.trainer_config.methods``
(``register``), replacing the torch-free contract of its name; a new method is one
``register(DrafterMethod(...))`` (``tests/test_method_registry.py`` adds a toy one).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from dfo_contract.trainer_config import methods as contract_registry
from dfo_contract.trainer_config.methods import MethodContract, register

from ..model.dflash2 import DFlash2Drafter, DFlash2Spec, build_dflash2, dflash2_extra_flops
from ..model.drafter import Drafter
from . import objective, objective_dflash2


def _none(*_a) -> None:
    return None


def _no_args(_cfg) -> tuple:
    return ()


@dataclass(frozen=True, kw_only=True)
class DrafterMethod(MethodContract):
    """A method's contract plus what the trainer runs of it (see the module docstring)."""
    build: Callable[..., Drafter]
    build_exported: Callable[..., Drafter]
    forward_loss: Callable = objective.dflash_forward_loss
    step_name: str = "drafter_step"
    step_args: Callable[[Any], tuple] = _no_args
    prepare: Callable[[Any, Any], None] = _none
    before_step: Callable[[list, Any, int, int], None] = _none
    served_draft: Callable | None = None
    own_spec: Callable[[Any], Any] = _none
    extra_flops: Callable[..., dict] | None = None

    def new(self, spec, model_cfg, shared) -> Drafter:
        """``build``, the drafter marked with this method (``drafter.method``)."""
        return self._mark(self.build(spec, model_cfg, shared))

    def new_exported(self, conf: dict, spec, shared) -> Drafter:
        """``build_exported``, the drafter marked with this method."""
        return self._mark(self.build_exported(conf, spec, shared))

    def _mark(self, drafter: Drafter) -> Drafter:
        drafter.method = self.name
        return drafter

    @classmethod
    def of(cls, contract: MethodContract, **torch_part) -> "DrafterMethod":
        """The record of ``contract``'s method with its torch part ``torch_part``."""
        return cls(**{f.name: getattr(contract, f.name) for f in fields(MethodContract)},
                   **torch_part)


def method_of(cfg_or_name) -> DrafterMethod:
    """The record of ``model.method`` (a config, a model config or a name)."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else \
        getattr(cfg_or_name, "model", cfg_or_name).method
    m = contract_registry.contract(name)
    if not isinstance(m, DrafterMethod):
        raise KeyError(f"model.method {name!r} has no trainer part registered")
    return m


def of_drafter(drafter) -> DrafterMethod:
    """The record of a built drafter's method (``drafter.method``; a module without one: the
    default method's)."""
    return method_of(getattr(drafter, "method", contract_registry.DEFAULT_METHOD))


def of_export(conf: dict) -> DrafterMethod:
    """The record of the method an exported config.json object declares."""
    return method_of(contract_registry.of_export(conf).name)


# --------------------------------------------------------------------------- DFlash

def _dflash_build(spec, model_cfg, shared) -> Drafter:
    return Drafter(spec, shared)


def _dflash_exported(conf, spec, shared) -> Drafter:
    return Drafter(spec, shared)


DFLASH = register(DrafterMethod.of(contract_registry.DFLASH, build=_dflash_build,
                                   build_exported=_dflash_exported))


# --------------------------------------------------------------------------- DFlash2

def _dflash2_build(spec, model_cfg, shared) -> Drafter:
    return build_dflash2(spec, _dflash2_spec(model_cfg), shared)


def _dflash2_spec(model_cfg) -> DFlash2Spec:
    return DFlash2Spec.from_settings(model_cfg.block_size, model_cfg.settings())


def _dflash2_exported(conf, spec, shared) -> Drafter:
    return DFlash2Drafter(spec, DFlash2Spec(**contract_registry.dflash2_fields(conf)), shared)


def _dflash2_prepare(drafter, train_cfg) -> None:
    if train_cfg.selector_loss_alpha <= 0:
        drafter.freeze_selector()


def _dflash2_step_args(cfg) -> tuple:
    t = cfg.train
    return (t.selector_gold_insert, t.selector_stop_gradient, t.selector_loss_alpha > 0)


def _dflash2_before_step(drafters, cfg, step: int, horizon: int) -> None:
    alpha = objective_dflash2.selector_alpha_at(cfg.train, step, horizon)
    for dr in drafters:
        dr.set_selector_alpha(alpha)


def _dflash2_served(drafter, hidden, anchor_ids):
    return drafter.greedy_path(hidden, anchor_ids)


def _dflash2_flops(spec, own, *, tq: int, label_rows: int) -> dict:
    return dflash2_extra_flops(spec, own, tq=tq, label_rows=label_rows)


DFLASH2 = register(DrafterMethod.of(
    contract_registry.DFLASH2, build=_dflash2_build, build_exported=_dflash2_exported,
    forward_loss=objective_dflash2.dflash2_forward_loss, step_name="dflash2_step",
    step_args=_dflash2_step_args, prepare=_dflash2_prepare, before_step=_dflash2_before_step,
    served_draft=_dflash2_served, own_spec=_dflash2_spec, extra_flops=_dflash2_flops))
