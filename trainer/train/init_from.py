"""``model.init_from``: fine-tune a released drafter: DFlash (dfo's export or z-lab's layout) or
DFlash2 (the layout SGLang and vLLM load, which dfo's DFlash2 export writes).

``resolve(cfg)`` runs before anything is built: the directory's ``config.json`` gives the
drafter layers, tapped target layers, block size and mask token, and for DFlash2 the
``dflash_config`` fields (conv kernel/group size, selector rank/top-k, logit cap, output
multiplier), and for both methods the layers' attention as the directory declares it:
``layer_types``, ``sliding_window`` and ``is_causal`` (absent: sliding layers causal, full
ones bidirectional, the rule z-lab's class applies). A drafter with parts dfo cannot train
(attention sinks, a separate mask embedding, an input embedding scale other than 1, another
layer type) is refused in one line naming the part. A setting given in the config file or a flag that differs from the drafter's is a one-line
error naming the flag; an unset one takes the drafter's value (the checkpoints' config.yaml
then records it). The method is never taken from the directory: a DFlash2 drafter needs
``model.method: dflash2`` and a DFlash one ``dflash``, else one line names the flag.

``load_into(cfg, target, drafter)`` runs once the target is loaded and the drafter built:
a drafter made for another target (hidden size, vocabulary, layer count) is refused in one
line; then the weights are loaded strictly (every name, every shape). Nothing else is taken
from the directory: no optimizer state, no step, no data position; a resumed run's
checkpoint still wins over these weights.
"""

from __future__ import annotations

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig, validate

from ..evaluate.dflash_dir import DFlashDir, load_weights, read_dflash_dir

FLAG = "--model.init_from"
NAMES = {"dflash": "DFlash", "dflash2": "DFlash2"}


def _check_method(cfg: TrainerConfig, dd: DFlashDir) -> None:
    have = cfg.model.method
    if dd.method == have:
        return
    other = "a DFlash2" if have == "dflash2" else "a DFlash"
    raise TrainerConfigError(
        f"config: --model.method: {have} cannot start from {FLAG} {dd.path}, a "
        f"{NAMES[dd.method]} drafter; set --model.method {dd.method} or give {other} drafter")


def _dflash2_settings(dd: DFlashDir) -> list[tuple[str, object]]:
    from ..evaluate.export_dflash2 import spec_from_export

    try:
        d2 = spec_from_export(dd.config)
    except KeyError as e:
        raise TrainerConfigError(f"config: {FLAG}: {dd.path}: config.json's DFlash2 "
                                 f"dflash_config lacks {e}") from None
    except (TypeError, ValueError) as e:
        raise TrainerConfigError(f"config: {FLAG}: {dd.path}: config.json has a malformed "
                                 f"DFlash2 field ({e})") from None
    return [(name, getattr(d2, name)) for name in (
        "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
        "final_logit_softcapping", "output_multiplier")]


def _attention_settings(dd: DFlashDir) -> list[tuple[str, object]]:
    """``model.layer_types``, ``model.sliding_window`` (when a layer slides) and
    ``model.is_causal`` (None: the directory leaves it out)."""
    window = max((la.window for la in dd.attention), default=0)
    out: list[tuple[str, object]] = [("layer_types", [la.kind for la in dd.attention])]
    if window:
        out.append(("sliding_window", window))
    return out + [("is_causal", dd.config.get("is_causal"))]


def resolve(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with the drafter's taps, block size, mask token, layer count and, for DFlash2,
    its method fields (in place)."""
    path = cfg.model.init_from
    if not path:
        return cfg
    dd = read_dflash_dir(path, flag=FLAG)
    _check_method(cfg, dd)
    explicit = getattr(cfg, "explicit_keys", set())
    taps = list(dd.target_layer_ids) if dd.target_layer_ids is not None else None
    settings = [("drafter_layers", dd.num_layers), ("target_layer_ids", taps),
                ("block_size", dd.block_size), ("mask_token_id", dd.mask_token_id)]
    if dd.method == "dflash2":
        settings += _dflash2_settings(dd)
    settings += _attention_settings(dd)
    for name, val in settings:
        if val is None and name != "is_causal":
            continue
        cur = getattr(cfg.model, name)
        if f"model.{name}" in explicit and (cur is not None or name == "is_causal") and cur != val:
            raise TrainerConfigError(
                f"config: --model.{name}: {cur} conflicts with the drafter's {val} in {FLAG} "
                f"{path}; drop --model.{name} or set it to {val}")
        setattr(cfg.model, name, val)
    return validate(cfg)


def load_into(cfg: TrainerConfig, target, drafter) -> None:
    """Check the drafter directory fits ``target``; load its weights into ``drafter``."""
    path = cfg.model.init_from
    dd = read_dflash_dir(path, flag=FLAG)
    _check_method(cfg, dd)
    have = {"hidden size": int(target.config.hidden_size), "vocabulary": int(target.vocab_size),
            "layer count": int(target.num_layers_total)}
    want = {"hidden size": dd.hidden_size, "vocabulary": dd.vocab_size,
            "layer count": dd.num_target_layers}
    for what, v in want.items():
        if v is not None and v != have[what]:
            raise TrainerConfigError(
                f"config: {FLAG}: {path} is a drafter for a target with {what} {v}, but "
                f"{cfg.model.target_path} has {have[what]}; give a drafter made for this target")
    try:
        drafter.load_trainable_state_dict({k: v.float() for k, v in load_weights(dd).items()})
    except KeyError as e:
        raise TrainerConfigError(f"config: {FLAG}: {path}: {e.args[0]}") from None
