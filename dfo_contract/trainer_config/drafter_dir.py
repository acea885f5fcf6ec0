"""``model.init_from``: the settings a run takes from a released drafter's ``config.json``
(pure, torch-free). The trainer (``trainer.core.init_from``) and ``dfo launch`` /
``dfo warm-cache`` (``orchestrator.plan.init_from``, from the directory's config.json read on
the host) run this same code, so the config dfo validates and keys the compile cache by is
the one the trainer runs.

``drafter_json(text, path)``    config.json's text as an object (one-line errors)
``read_drafter(conf, path)``    what the drafter declares (:class:`DrafterConfig`), refusing
                                what dfo cannot train (biases, attention sinks, a separate
                                mask embedding, an input embedding scale other than 1, a layer
                                type other than full or sliding)
``effective_config(cfg, conf)`` ``cfg`` with the drafter's settings (in place), validated

The settings taken: drafter layers, tapped target layers, block size and mask token; for
DFlash2 the ``dflash_config`` fields (conv kernel/group size, selector rank/top-k, logit
cap, output multiplier); for both methods the layers' attention as z-lab's class serves it:
``layer_types``, ``sliding_window`` (when a layer slides) and ``is_causal`` (absent: vLLM's
``dflash_config.causal`` as vLLM reads it, for every layer; neither: sliding layers causal,
full ones bidirectional). What one engine spells its own way is read as that engine does or
refused in one line: ``is_causal`` and ``dflash_config.causal`` that disagree, a
``sliding_window`` without ``use_sliding_window: true`` (z-lab drops it, vLLM keeps it), vLLM's
``use_swa``/``swa_window_size`` that do not restate ``layer_types``/``sliding_window``,
vLLM's sink biases (``attention_sink_bias``, ``add_swa_attention_sink_bias``), a MiMo
``mask_embedding.pt`` beside the weights (``check_files``). A setting the config file or a flag gives that
differs from the drafter's is a one-line error naming the flag; an unset one takes the
drafter's value. The method is never taken: a DFlash2 drafter (``architectures``
``["DFlash2DraftModel"]``) needs ``model.method: dflash2`` and a DFlash one ``dflash``.
Every problem is one ``TrainerConfigError`` line naming the flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..exitcodes import TrainerConfigError
from . import methods as method_registry
from .layers import LayerAttention, Unservable, served_pattern
from .parse import validate
from .schema import TrainerConfig

FLAG = "--model.init_from"


def _bad(path: str, why: str, flag: str) -> TrainerConfigError:
    return TrainerConfigError(f"config: {flag}: {path}: {why}")


@dataclass(frozen=True)
class DrafterConfig:
    """What a drafter directory's config.json declares."""
    path: str
    method: str                                # dflash | dflash2 (trainer_config.methods)
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_target_layers: int | None
    target_layer_ids: tuple[int, ...] | None   # None: the default formula
    block_size: int | None
    mask_token_id: int | None
    attention: tuple[LayerAttention, ...]      # each layer's attention as it is served
    is_causal: bool | None   # is_causal, else dflash_config.causal (None: neither)
    settings: tuple[tuple[str, Any], ...] = ()  # the method's own fields (DFlash2's)


def _opt_int(v):
    return None if v is None else int(v)


def drafter_json(text: str | bytes | None, path: str, *, flag: str = FLAG,
                 unreadable: str = "") -> dict:
    """The object of a drafter directory's config.json; ``text`` None: the directory has
    none; ``unreadable``: why it could not be read."""
    if text is None:
        raise _bad(path, "no config.json (give an exported DFlash drafter directory)", flag)
    if unreadable:
        raise _bad(path, f"config.json is not readable ({unreadable})", flag)
    try:
        conf = json.loads(text)
    except ValueError as e:
        raise _bad(path, f"config.json is not readable JSON ({e})", flag) from None
    require_dflash(conf, path, flag=flag)
    return conf


def require_dflash(conf: Any, path: str, *, flag: str = FLAG) -> None:
    if not isinstance(conf, dict) or not isinstance(conf.get("dflash_config"), dict):
        raise _bad(path, "config.json has no dflash_config: not a DFlash drafter", flag)


#: files beside config.json that hold a part this trainer's drafter has none for
EXTRA_PARTS = {"mask_embedding.pt": "a separate mask embedding (MiMo's mask_embedding.pt)"}
#: config keys of attention sinks (z-lab's, and vLLM's sink biases)
SINK_KEYS = ("attention_sinks", "use_attention_sinks", "num_sink_tokens", "use_sinks",
             "attention_sink_bias", "add_swa_attention_sink_bias")
#: vLLM's own spelling of a sliding window (``dflash_config`` or top level)
VLLM_SWA_KEYS = ("use_swa", "swa_window_size")


def check_files(names, path: str, *, flag: str = FLAG) -> None:
    """A drafter directory holding ``names`` (its files' names): one line for a file that
    carries a part this trainer's drafter has none for (it would be dropped silently)."""
    for name in sorted(set(names) & set(EXTRA_PARTS)):
        raise _bad(path, f"{EXTRA_PARTS[name]}: dfo cannot train that; give a drafter "
                         "without it", flag)


def _unsupported(conf: dict) -> str | None:
    """What config.json declares that this trainer's drafter has no part for, or None (the
    weights' names are the trainer's to check: it reads them)."""
    dc = conf.get("dflash_config") or {}
    scale = conf.get("input_embedding_scale", dc.get("input_embedding_scale"))
    if scale is not None and float(scale) != 1.0:
        return f"input_embedding_scale {scale}"
    for key in SINK_KEYS:
        if conf.get(key) or dc.get(key):
            return f"attention sinks ({key}: {conf.get(key, dc.get(key))})"
    if dc.get("mask_embedding") or conf.get("mask_embedding"):
        return "a separate mask embedding (mask_embedding)"
    return None


def _vllm_window(conf: dict) -> str | None:
    """Why vLLM's ``use_swa``/``swa_window_size`` cannot be read as the layers' window (they
    must restate ``layer_types`` and ``sliding_window``), or None."""
    dc = conf.get("dflash_config") or {}
    given = {k: conf.get(k, dc.get(k)) for k in VLLM_SWA_KEYS if k in conf or k in dc}
    if not given:
        return None
    sliding = "sliding_attention" in (conf.get("layer_types") or [])
    window = conf.get("sliding_window") or 0
    use = given.get("use_swa")
    size = given.get("swa_window_size")
    if (use is None or bool(use) == sliding) and (size is None or not sliding or
                                                   int(size) == int(window)):
        return None
    said = ", ".join(f"{k} {v}" for k, v in given.items())
    return (f"vLLM's sliding-window keys ({said}) disagree with layer_types/sliding_window "
            f"(sliding layers: {'yes' if sliding else 'none'}, sliding_window {window or None}); "
            "engines other than vLLM read only the latter: make them agree or drop the vLLM keys")


def _window_dropped(conf: dict) -> str | None:
    """Sliding layers whose window z-lab's class drops (transformers' Qwen3Config keeps
    ``sliding_window`` only with ``use_sliding_window: true``) while vLLM and SGLang keep it:
    why, or None."""
    if "sliding_attention" not in (conf.get("layer_types") or []) or \
            not conf.get("sliding_window") or conf.get("use_sliding_window") is True:
        return None
    return (f"sliding_window {conf['sliding_window']} without use_sliding_window: true: z-lab's "
            "class (transformers' Qwen3Config) drops the window, vLLM and SGLang keep it; set "
            "use_sliding_window: true if it was trained with the window")


def _causal(conf: dict) -> tuple[bool | None, str]:
    """(the drafter's causality within the block, the engine whose reading gives it): a
    top-level ``is_causal``; else vLLM's ``dflash_config.causal`` read as vLLM reads it (for
    every layer); else None (sliding layers causal, full ones bidirectional). ValueError
    when the two keys disagree: engines would serve it differently."""
    top = conf.get("is_causal")
    dc = (conf.get("dflash_config") or {}).get("causal")
    if top is not None and dc is not None and bool(top) != bool(dc):
        raise ValueError(f"is_causal {top} and dflash_config.causal {dc} disagree (vLLM "
                         "before 0.28 and LMDeploy read the latter, the other engines the "
                         "former); make them agree")
    if top is None and dc is not None:
        return bool(dc), "vllm"
    return top, "z-lab"


def read_drafter(conf: dict, path: str, *, flag: str = FLAG) -> DrafterConfig:
    """``conf`` (a config.json object) as a :class:`DrafterConfig`; a one-line
    ``TrainerConfigError`` naming ``flag`` for a drafter dfo cannot train."""
    require_dflash(conf, path, flag=flag)
    dc = conf["dflash_config"]
    if conf.get("attention_bias") or conf.get("mlp_bias"):
        raise _bad(path, "the drafter has bias weights (attention_bias/mlp_bias); this "
                         "trainer's drafter has none", flag)
    try:
        unsupported = _unsupported(conf)
    except (TypeError, ValueError) as e:
        raise _bad(path, f"config.json has a malformed field ({e})", flag) from None
    if unsupported:
        raise _bad(path, f"{unsupported}: dfo cannot train that; give a drafter without it", flag)
    try:
        swa = _vllm_window(conf) or _window_dropped(conf)
        is_causal, reader = _causal(conf)
    except (TypeError, ValueError) as e:
        raise _bad(path, f"{e}", flag) from None
    if swa:
        raise _bad(path, swa, flag)
    try:
        attention = served_pattern(conf, reader)
    except Unservable as e:
        raise _bad(path, f"{e}", flag) from None
    except (KeyError, TypeError, ValueError) as e:
        raise _bad(path, f"config.json has a malformed attention field ({e})", flag) from None
    c = method_registry.of_export(conf)
    method = c.name
    try:
        taps = dc.get("target_layer_ids")
        d = DrafterConfig(
            path=path, method=method, num_layers=int(conf["num_hidden_layers"]),
            hidden_size=int(conf["hidden_size"]), vocab_size=int(conf["vocab_size"]),
            num_target_layers=_opt_int(dc.get("num_target_layers", conf.get("num_target_layers"))),
            target_layer_ids=None if taps is None else tuple(int(i) for i in taps),
            block_size=_opt_int(dc.get("block_size", conf.get("block_size"))),
            mask_token_id=_opt_int(dc.get("mask_token_id")), attention=attention,
            is_causal=is_causal)
    except KeyError as e:
        raise _bad(path, f"config.json lacks {e}", flag) from None
    except (TypeError, ValueError) as e:
        raise _bad(path, f"config.json has a malformed DFlash field ({e})", flag) from None
    if c.read_settings is None:
        return d
    try:
        own = c.read_settings(conf)
    except KeyError as e:
        raise _bad(path, f"config.json's {c.label} dflash_config lacks {e}", flag) from None
    except (TypeError, ValueError) as e:
        raise _bad(path, f"config.json has a malformed {c.label} field ({e})", flag) from None
    return replace(d, settings=tuple((n, own[n]) for n in c.setting_names()))


def check_method(cfg: TrainerConfig, method: str, path: str) -> None:
    """``model.method`` must be the drafter's: one line naming the flag otherwise."""
    have = cfg.model.method
    if method == have:
        return
    other = f"a {method_registry.contract(have).label}"
    raise TrainerConfigError(
        f"config: --model.method: {have} cannot start from {FLAG} {path}, a "
        f"{method_registry.contract(method).label} drafter; set --model.method {method} or "
        f"give {other} drafter")


def settings(d: DrafterConfig) -> list[tuple[str, Any]]:
    """``(model field, value)`` the drafter gives a run (None: it leaves the field to the
    config, except ``is_causal``, whose None is a value: sliding causal, full bidirectional)."""
    window = max((la.window for la in d.attention), default=0)
    taps = list(d.target_layer_ids) if d.target_layer_ids is not None else None
    out: list[tuple[str, Any]] = [("drafter_layers", d.num_layers), ("target_layer_ids", taps),
                                  ("block_size", d.block_size), ("mask_token_id", d.mask_token_id)]
    out += list(d.settings)
    out.append(("layer_types", [la.kind for la in d.attention]))
    if window:
        out.append(("sliding_window", window))
    return out + [("is_causal", d.is_causal)]


def effective_config(cfg: TrainerConfig, conf: dict) -> TrainerConfig:
    """``cfg`` with the settings of the drafter named by ``cfg.model.init_from``, whose
    config.json object is ``conf`` (in place), validated; ``cfg`` as is without init_from.
    Which keys the file or a flag set is ``cfg.explicit_keys``."""
    path = cfg.model.init_from
    if not path:
        return cfg
    d = read_drafter(conf, path)
    check_method(cfg, d.method, path)
    explicit: set[str] = getattr(cfg, "explicit_keys", set())
    for name, val in settings(d):
        if val is None and name != "is_causal":
            continue
        cur = cfg.model.get_flat(name)
        if f"model.{name}" in explicit and (cur is not None or name == "is_causal") and cur != val:
            raise TrainerConfigError(
                f"config: --model.{name}: {cur} conflicts with the drafter's {val} in {FLAG} "
                f"{path}; drop --model.{name} or set it to {val}")
        cfg.model.set_flat(name, val)
    return validate(cfg)
