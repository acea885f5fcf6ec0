"""Reading a transformers causal-LM directory: from disk only, quietly, optionally with fewer
decoder layers than it holds (``shortened``/``restored``) and placed on its device as it is
read. Used by the target, regeneration, speculative evaluation and the benchmarks."""

from __future__ import annotations

import torch


def quiet_transformers() -> None:
    try:
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except Exception:  # noqa: BLE001 - cosmetics only
        pass


def from_pretrained(path: str, dtype: torch.dtype, *, config=None, device=None):
    """``AutoModelForCausalLM.from_pretrained`` from the local directory only; ``config``
    replaces the directory's, ``device`` places the weights there as they are read (when
    ``accelerate`` is installed: transformers requires it for ``device_map``)."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    kw: dict = dict(local_files_only=True, attn_implementation="sdpa")
    if config is not None:
        kw["config"] = config
    if device is not None and can_place_on_load():
        kw["device_map"] = {"": torch.device(device)}
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    except TypeError:  # transformers 4.x spells it torch_dtype
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kw)


def can_place_on_load() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


#: per-layer config lists that must have ``num_hidden_layers`` entries
PER_LAYER_FIELDS = ("layer_types",)


def shortened(config, keep: int) -> dict:
    """Set ``config`` to ``keep`` decoder layers (per-layer lists cut alike); return the
    fields it had, for :func:`restored`."""
    old = {"num_hidden_layers": config.num_hidden_layers}
    config.num_hidden_layers = keep
    for f in PER_LAYER_FIELDS:
        v = getattr(config, f, None)
        if isinstance(v, (list, tuple)) and len(v) >= keep:
            old[f] = v
            setattr(config, f, type(v)(v[:keep]))
    return old


def restored(config, old: dict) -> None:
    for f, v in old.items():
        setattr(config, f, v)
