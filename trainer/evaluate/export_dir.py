"""A servable export: ``python -m trainer export CHECKPOINT --out DIR [--dtype bf16]``.

Writes a Hugging Face directory in the layout of z-lab's released DFlash drafters, which
vLLM's ``dflash`` speculative method, SGLang's ``DFLASH`` algorithm, z-lab's
``DFlashDraftModel`` and transformers' ``trust_remote_code`` read:

- ``config.json``: the drafter's config (``export_config.drafter_config``: the target's
  width, heads, MLP size, eps, vocab, RoPE in both spellings, max positions;
  ``num_hidden_layers`` = drafter layers; the layers' attention exactly as trained,
  ``layer_types``, ``sliding_window`` and ``is_causal`` (``served.export_fields``; a pattern
  some engine would serve differently is refused, naming the engine and layer); no biases, ``num_target_layers``, ``block_size``, ``dflash_config: {mask_token_id,
  target_layer_ids, block_size}``, ``auto_map`` to ``modeling_dflash.py``);
- ``model.safetensors``: the drafter's weights under the module's names (``fc``,
  ``hidden_norm``, ``layers.N.self_attn.q_proj``, ..., ``norm``), in ``--dtype`` (bf16
  default); no embedding or LM head (the target's are used);
- ``modeling_dflash.py``: the drafter as a transformers model (``trainer.model.modeling_dflash``;
  a method without ``remote_code``, DFlash2, ships none and its ``export_config`` turns the
  config.json into its own: ``trainer.core.methods``);
- ``README.md``: how it was trained and how to serve it;
- ``dfo_export.json``: the source checkpoint and the sha256 and size of every file.

Built in ``.DIR.tmp-<pid>`` and renamed into place. ``load_exported(DIR, target)`` rebuilds
the drafter from the directory alone (plus the target's embedding and LM head).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

from dfo_contract.exitcodes import CheckpointError, TrainerConfigError
from dfo_contract.fsio import fsync_dir, replace_dir, sha256_file

from dfo_contract.trainer_config.layers import layer_pattern

from ..core.methods import method_of, of_export
from .export_config import DTYPES, MODULE_FILE, MODULE_SOURCE, drafter_config, readme
from .served import Unservable, check_served, parse_engines, with_export_fields

MANIFEST = "dfo_export.json"
FP8_NOTE = ("\n## Trained on fp8 target features\n\nThis drafter learned from the target's "
            "features with the target's decoder-layer linears in fp8 (`model.target_fp8`: e4m3 "
            "weights, rowwise scales). Engines serve it on the full-precision target; "
            "`dfo_export.json` says `\"target_precision\": \"fp8\"`.\n")


def _checkpoint_config(ckpt: str):
    from dfo_contract import checkpoints as cm
    from dfo_contract.trainer_config import config_from_dict

    import yaml

    ok, why = cm.verify(ckpt)
    if not ok:
        raise CheckpointError(f"checkpoint: {ckpt} is not usable: {why}")
    with open(os.path.join(ckpt, "config.yaml")) as f:
        raw = yaml.safe_load(f)
    cfg = config_from_dict(raw)
    model = (raw or {}).get("model") or {}
    if "is_causal" not in model and method_of(cfg).sliding_layers and cfg.model.sliding_window:
        # a checkpoint of a sliding method (DFlash2) whose config predates model.is_causal was
        # trained with window layers causal within the block: say so, so that export declares it
        cfg.model.is_causal = True
    with open(os.path.join(ckpt, "data.json")) as f:
        data = json.load(f)
    return cfg, data


def export(ckpt: str, out: str, *, dtype: str = "bf16", target_path: str | None = None,
           engines: str = "all") -> dict:
    """Export checkpoint ``ckpt`` to ``out`` (atomically). Returns the export manifest.

    ``engines`` (comma separated, default all of ``served.ENGINES``): the engines that must
    serve every layer as it was trained, else the export is refused."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    if dtype not in DTYPES:
        raise TrainerConfigError(f"config: --dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    cfg, data = _checkpoint_config(ckpt)
    tpath = target_path or cfg.model.target_path
    if not tpath or not os.path.isfile(os.path.join(tpath, "config.json")):
        raise TrainerConfigError(f"config: --target: {tpath or '(none)'} has no config.json (give "
                                 "the target model directory the checkpoint was trained against)")
    tcfg = AutoConfig.from_pretrained(tpath, local_files_only=True)
    from ..model.drafter import DrafterSpec
    from ..model.target import tapped_layer_ids
    from ..core.step import tokenizer_mask_id

    n_target = int(tcfg.num_hidden_layers)
    taps = tapped_layer_ids(n_target, cfg.model.drafter_layers, cfg.model.target_layer_ids)
    mask_id = cfg.model.mask_token_id
    if mask_id is None:
        mask_id = tokenizer_mask_id(tpath)
    if mask_id is None:
        raise TrainerConfigError("config: --model.mask_token_id: the checkpoint's config and the "
                                 "target's tokenizer name no mask token")
    sd = load_file(os.path.join(ckpt, "drafter.safetensors"))
    tdt = getattr(torch, DTYPES[dtype])
    sd = {k: v.to(tdt).contiguous() for k, v in sd.items()}
    pattern = layer_pattern(cfg.model)
    spec = DrafterSpec.from_target_config(tcfg, num_layers=cfg.model.drafter_layers,
                                          num_taps=len(taps), attention=pattern)
    conf = drafter_config(tcfg, num_layers=cfg.model.drafter_layers, tap_ids=taps,
                          num_target_layers=n_target, block_size=cfg.model.block_size,
                          mask_token_id=mask_id, dtype=dtype, head_dim=spec.head_dim)
    method = method_of(cfg)
    if method.export_config is not None:
        conf = method.export_config(conf, cfg.model, cfg.model.settings())
    try:
        held = parse_engines(engines)
    except ValueError as e:
        raise TrainerConfigError(f"config: --engines: {e}") from None
    try:
        conf = with_export_fields(conf, pattern)
        check_served(pattern, conf, held)
    except Unservable as e:
        others = ",".join(n for n in held if not str(e).startswith(f"{n} ")) or "none"
        mixed = len({la.causal for la in pattern}) > 1
        cure = ("train with one --model.is_causal for every layer" if mixed else
                "train with --model.is_causal false for it")
        raise TrainerConfigError(
            f"config: export: {ckpt}: {e}; {cure}, or export for the other engines only "
            f"(--engines {others})") from None
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    if method.remote_code:   # the trust_remote_code module is DFlash's
        shutil.copyfile(MODULE_SOURCE, os.path.join(tmp, MODULE_FILE))
    precision = "fp8" if cfg.model.target_fp8 else "full"
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(readme(target=tpath, data=cfg.data.path, steps=int(data.get("step", 0)),
                       accept_len=data.get("accept_len"), block_size=cfg.model.block_size,
                       layers=cfg.model.drafter_layers, tap_ids=taps, source=os.path.abspath(ckpt),
                       init_from=cfg.model.init_from, method=method.name))
        if precision == "fp8":
            f.write(FP8_NOTE)
    files = {}
    for name in sorted(os.listdir(tmp)):
        p = os.path.join(tmp, name)
        with open(p, "rb+") as fh:
            os.fsync(fh.fileno())
        files[name] = {"sha256": sha256_file(p), "size": os.path.getsize(p)}
    man = {"format": "dfo-dflash-export-1", "source": os.path.abspath(ckpt),
           "step": int(data.get("step", 0)), "accept_len": data.get("accept_len"),
           "dtype": dtype, "target_precision": precision, "files": files}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(man, f, indent=1, sort_keys=True)
    fsync_dir(tmp)
    replace_dir(tmp, out)
    return man


def verify_export(d: str) -> tuple[bool, str]:
    """Every file listed in dfo_export.json is present with its size and sha256."""
    try:
        with open(os.path.join(d, MANIFEST)) as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        return False, f"no readable {MANIFEST} ({e})"
    for name, meta in man.get("files", {}).items():
        p = os.path.join(d, name)
        if not os.path.isfile(p) or os.path.getsize(p) != meta["size"]:
            return False, f"{name}: missing or wrong size"
        if sha256_file(p) != meta["sha256"]:
            return False, f"{name}: sha256 mismatch"
    return True, "ok"


def load_exported(d: str, *, embed_tokens, lm_head, device="cpu"):
    """The drafter rebuilt from an exported directory alone (+ the target's embed/head)."""
    from ..model.drafter import DrafterSpec, SharedHead
    from ..model.dflash_dir import hf_config, load_weights, read_dflash_dir

    dd = read_dflash_dir(d, flag="export")
    dc = dd.drafter
    if dc.target_layer_ids is None or dc.block_size is None or dc.mask_token_id is None:
        raise TrainerConfigError(f"config: export: {d}: dflash_config needs target_layer_ids, "
                                 "mask_token_id and block_size")
    spec = DrafterSpec.from_target_config(hf_config(dd), num_layers=dc.num_layers,
                                          num_taps=len(dc.target_layer_ids),
                                          attention=dc.attention)
    drafter = of_export(dd.config).new_exported(dd.config, spec, SharedHead(embed_tokens, lm_head))
    drafter.load_trainable_state_dict({k: v.float() for k, v in load_weights(dd).items()})
    drafter.to(device)
    drafter.mask_token_id = dc.mask_token_id
    drafter.block_size = dc.block_size
    drafter.target_layer_ids = list(dc.target_layer_ids)
    drafter.attn_backend = "sdpa"
    return drafter  # fp32 weights; the caller casts


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer export")
    ap.add_argument("checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--target", default=None, help="target directory (default: the checkpoint's)")
    ap.add_argument("--engines", default="all",
                    help="engines that must serve every layer as trained (comma separated: "
                         "z-lab,vllm,vllm-0.27,sglang,lmdeploy,llama.cpp; default all)")
    a = ap.parse_args(argv)
    man = export(a.checkpoint, a.out, dtype=a.dtype, target_path=a.target, engines=a.engines)
    print(json.dumps({"kind": "export", "out": os.path.abspath(a.out), "step": man["step"],
                      "accept_len": man["accept_len"],
                      "target_precision": man["target_precision"], "files": man["files"]}))
    return 0
