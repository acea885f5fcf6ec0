"""Reading an exported DFlash or DFlash2 drafter directory: dfo's export or z-lab's published
layout (DFlash2: the layout of ``trainer.evaluate.export_dflash2``, which SGLang and vLLM load).

Both hold ``config.json`` (Qwen3 fields, ``num_hidden_layers`` = drafter layers, and
``dflash_config: {target_layer_ids, mask_token_id[, block_size]}``; ``block_size`` and
``num_target_layers`` may also be top-level) and the weights in ``*.safetensors`` under the
names ``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``. ``read_dflash_dir`` checks the
drafter is one this trainer's architecture can hold (no biases, no attention sinks, no
separate mask embedding, an input embedding scale of 1; layer types full or sliding) and
reads its layers' attention as z-lab's class serves it (``served.served_pattern``); it returns what the trainer needs in a ``DFlashDir`` (``method`` is ``dflash2`` when
``architectures`` is ``["DFlash2DraftModel"]``); ``load_weights`` reads the tensors.
Every problem is one ``TrainerConfigError`` line naming the flag that pointed here.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config.layers import LayerAttention

from .served import Unservable, served_pattern


@dataclass(frozen=True)
class DFlashDir:
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_target_layers: int | None
    target_layer_ids: tuple[int, ...] | None   # None: the default formula
    block_size: int | None
    mask_token_id: int | None
    weight_files: tuple[str, ...]
    config: dict = field(compare=False, repr=False)
    version: int = 1
    method: str = "dflash"                     # dflash2: architectures ["DFlash2DraftModel"]
    attention: tuple[LayerAttention, ...] = ()  # each layer's attention as served


def _opt_int(v):
    return None if v is None else int(v)


def read_dflash_dir(path: str, *, flag: str) -> DFlashDir:
    def bad(why: str) -> TrainerConfigError:
        return TrainerConfigError(f"config: {flag}: {path}: {why}")

    cpath = os.path.join(path, "config.json")
    try:
        with open(cpath) as f:
            conf = json.load(f)
    except FileNotFoundError:
        raise bad("no config.json (give an exported DFlash drafter directory)") from None
    except (OSError, ValueError) as e:
        raise bad(f"config.json is not readable JSON ({e})") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("dflash_config"), dict):
        raise bad("config.json has no dflash_config: not a DFlash drafter")
    dc = conf["dflash_config"]
    files = tuple(sorted(glob.glob(os.path.join(path, "*.safetensors"))))
    if not files:
        raise bad("no *.safetensors weights")
    if conf.get("attention_bias") or conf.get("mlp_bias"):
        raise bad("the drafter has bias weights (attention_bias/mlp_bias); this trainer's "
                  "drafter has none")
    dflash2 = list(conf.get("architectures") or []) == ["DFlash2DraftModel"]
    try:
        unsupported = _unsupported(conf, files)
    except (TypeError, ValueError) as e:
        raise bad(f"config.json has a malformed field ({e})") from None
    if unsupported:
        raise bad(f"{unsupported}: dfo cannot train that; give a drafter without it")
    try:
        attention = served_pattern(conf, "z-lab")
    except Unservable as e:
        raise bad(f"{e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"config.json has a malformed attention field ({e})") from None
    try:
        taps = dc.get("target_layer_ids")
        return DFlashDir(
            path=path, num_layers=int(conf["num_hidden_layers"]),
            hidden_size=int(conf["hidden_size"]), vocab_size=int(conf["vocab_size"]),
            num_target_layers=_opt_int(dc.get("num_target_layers", conf.get("num_target_layers"))),
            target_layer_ids=None if taps is None else tuple(int(i) for i in taps),
            block_size=_opt_int(dc.get("block_size", conf.get("block_size"))),
            mask_token_id=_opt_int(dc.get("mask_token_id")),
            weight_files=files, config=conf, method="dflash2" if dflash2 else "dflash",
            attention=attention)
    except KeyError as e:
        raise bad(f"config.json lacks {e}") from None
    except (TypeError, ValueError) as e:
        raise bad(f"config.json has a malformed DFlash field ({e})") from None


def _weight_names(files) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for p in files:
        try:
            with safe_open(p, framework="pt") as f:
                names += list(f.keys())
        except Exception:  # noqa: BLE001 - an unreadable file is load_weights' error to name
            continue
    return names


def _unsupported(conf: dict, files) -> str | None:
    """What the drafter declares that this trainer's drafter has no part for, or None."""
    dc = conf.get("dflash_config") or {}
    scale = conf.get("input_embedding_scale", dc.get("input_embedding_scale"))
    if scale is not None and float(scale) != 1.0:
        return f"input_embedding_scale {scale}"
    for key in ("attention_sinks", "use_attention_sinks", "num_sink_tokens", "use_sinks"):
        if conf.get(key) or dc.get(key):
            return f"attention sinks ({key}: {conf.get(key, dc.get(key))})"
    names = _weight_names(files)
    sinks = [n for n in names if n.rsplit(".", 1)[-1] in ("sinks", "sink")]
    if sinks:
        return f"attention sinks ({sinks[0]})"
    embed = [n for n in names if "mask_emb" in n]
    if embed or dc.get("mask_embedding") or conf.get("mask_embedding"):
        return f"a separate mask embedding ({embed[0] if embed else 'mask_embedding'})"
    return None


def hf_config(dd: DFlashDir):
    """The directory's config as a transformers ``Qwen3Config`` (width, heads, RoPE)."""
    from transformers import Qwen3Config

    skip = ("architectures", "auto_map", "dflash_config", "block_size", "num_target_layers",
            "model_type")
    return Qwen3Config(**{k: v for k, v in dd.config.items() if k not in skip})


def load_weights(dd: DFlashDir) -> dict:
    """Every tensor of the directory's safetensors files, as stored (dtype included)."""
    from safetensors.torch import load_file

    sd: dict = {}
    for p in dd.weight_files:
        sd.update(load_file(p))
    return sd
