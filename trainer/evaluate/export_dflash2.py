"""The DFlash2 parts of a servable export (``trainer.evaluate.export_dir`` calls these).

``config.json`` of a DFlash2 export is the DFlash one (the target's Qwen3 fields,
``num_hidden_layers``, ``num_target_layers``, ``block_size``) with

- ``architectures: ["DFlash2DraftModel"]``;
- ``dflash_config``: ``mask_token_id``, ``target_layer_ids`` and the DFlash2 fields
  ``block_size``, ``conv_kernel_size``, ``conv_group_size``, ``selector_rank``,
  ``selector_top_k``, ``final_logit_softcapping``, ``output_multiplier``;
and the layers' attention as for DFlash (``served.export_fields``: ``layer_types``,
``sliding_window``, ``is_causal``; by default every layer sliding and bidirectional within
the block), the layout SGLang's and vLLM's ``DFlash2DraftModel`` loaders read. ``model.safetensors``
holds the module's names (``layers.N.attention_conv.base_kernel``,
``candidate_selector.predecessor_codebook``, ...).
"""

from __future__ import annotations

from dfo_contract.trainer_config.drafter_dir import DFLASH2_ARCH as ARCH
from dfo_contract.trainer_config.drafter_dir import dflash2_fields, is_dflash2

__all__ = ["ARCH", "build_exported", "dflash2_config", "is_dflash2", "spec_from_export"]


def dflash2_config(conf: dict, model_cfg) -> dict:
    """``conf`` (a DFlash export's config.json object) turned into the DFlash2 one."""
    m = model_cfg
    c = dict(conf)
    c.pop("auto_map", None)   # modeling_dflash.py is DFlash's: serving engines load DFlash2
    c["architectures"] = [ARCH]
    dc = dict(c.get("dflash_config") or {})
    dc.update({"block_size": int(m.block_size), "conv_kernel_size": int(m.conv_kernel_size),
               "conv_group_size": int(m.conv_group_size), "selector_rank": int(m.selector_rank),
               "selector_top_k": int(m.selector_top_k),
               "final_logit_softcapping": float(m.final_logit_softcapping),
               "output_multiplier": float(m.output_multiplier)})
    c["dflash_config"] = dc
    return c


def spec_from_export(conf: dict):
    """The ``DFlash2Spec`` of an exported config.json object."""
    from ..model.dflash2 import DFlash2Spec

    return DFlash2Spec(**dflash2_fields(conf))


def build_exported(conf: dict, spec, shared):
    """An (untrained) DFlash2 drafter of the exported shape; the caller loads the weights."""
    from ..model.dflash2 import DFlash2Drafter

    return DFlash2Drafter(spec, spec_from_export(conf), shared)
