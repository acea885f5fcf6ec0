"""Reading an exported DFlash or DFlash2 drafter directory: dfo's export or z-lab's published
layout (DFlash2: the layout its export writes, ``trainer.core.methods``, which SGLang and vLLM load).

Both hold ``config.json`` (Qwen3 fields, ``num_hidden_layers`` = drafter layers, and
``dflash_config: {target_layer_ids, mask_token_id[, block_size]}``; ``block_size`` and
``num_target_layers`` may also be top-level) and the weights in ``*.safetensors`` under the
names ``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``. ``read_dflash_dir`` reads
config.json with ``dfo_contract.trainer_config.drafter_dir`` (the code dfo launch runs on
the same file: it checks the drafter is one this trainer's architecture can hold, no biases,
no attention sinks, no separate mask embedding, an input embedding scale of 1, layer types
full or sliding, and reads its layers' attention as z-lab's class serves it), checks the
weights' names for sinks and a mask embedding, and returns what the trainer needs in a
``DFlashDir`` (its ``drafter.method`` is ``dflash2`` when ``architectures`` is
``["DFlash2DraftModel"]``); ``load_weights`` reads the tensors.
Every problem is one ``TrainerConfigError`` line naming the flag that pointed here.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config.drafter_dir import (DrafterConfig, check_files, drafter_json,
                                                     read_drafter)


@dataclass(frozen=True)
class DFlashDir:
    """A drafter directory: what its config.json declares (``drafter``: the settings, shared
    with the orchestrator), that object itself, and its weight files."""
    drafter: DrafterConfig
    weight_files: tuple[str, ...]
    config: dict = field(compare=False, repr=False)


def read_dflash_dir(path: str, *, flag: str) -> DFlashDir:
    cpath = os.path.join(path, "config.json")
    try:
        with open(cpath, "rb") as f:
            text, why = f.read(), ""
    except FileNotFoundError:
        text, why = None, ""
    except OSError as e:
        text, why = b"", str(e)
    conf = drafter_json(text, path, flag=flag, unreadable=why)   # a DFlash drafter's, or one line
    files = tuple(sorted(glob.glob(os.path.join(path, "*.safetensors"))))
    if not files:
        raise TrainerConfigError(f"config: {flag}: {path}: no *.safetensors weights")
    d = read_drafter(conf, path, flag=flag)
    check_files(os.listdir(path), path, flag=flag)
    unsupported = _unsupported_weights(files)
    if unsupported:
        raise TrainerConfigError(f"config: {flag}: {path}: {unsupported}: dfo cannot train "
                                 "that; give a drafter without it")
    return DFlashDir(drafter=d, weight_files=files, config=conf)


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


def _unsupported_weights(files) -> str | None:
    """A weight this trainer's drafter has no part for (config.json's own declarations are
    ``drafter_dir.read_drafter``'s to refuse), or None."""
    names = _weight_names(files)
    sinks = [n for n in names if n.rsplit(".", 1)[-1] in ("sinks", "sink")]
    if sinks:
        return f"attention sinks ({sinks[0]})"
    embed = [n for n in names if "mask_emb" in n]
    if embed:
        return f"a separate mask embedding ({embed[0]})"
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
