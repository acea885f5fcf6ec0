"""``model.init_from``: fine-tune a released DFlash drafter (dfo's export or z-lab's layout).

``resolve(cfg)`` runs before anything is built: the directory's ``dflash_config`` gives the
drafter layers, tapped target layers, block size and mask token. A setting given in the
config file or a flag that differs from the drafter's is a one-line error naming the flag;
an unset one takes the drafter's value (the checkpoints' config.yaml then records it).

``load_into(cfg, target, drafter)`` runs once the target is loaded and the drafter built:
a drafter made for another target (hidden size, vocabulary, layer count) is refused in one
line; then the weights are loaded strictly (every name, every shape). Nothing else is taken
from the directory: no optimizer state, no step, no data position; a resumed run's
checkpoint still wins over these weights.
"""

from __future__ import annotations

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig, validate

from ..evaluate.dflash_dir import load_weights, read_dflash_dir

FLAG = "--model.init_from"


def resolve(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with the drafter's taps, block size, mask token and layer count (in place)."""
    path = cfg.model.init_from
    if not path:
        return cfg
    dd = read_dflash_dir(path, flag=FLAG)
    explicit = getattr(cfg, "explicit_keys", set())
    taps = list(dd.target_layer_ids) if dd.target_layer_ids is not None else None
    for name, val in (("drafter_layers", dd.num_layers), ("target_layer_ids", taps),
                      ("block_size", dd.block_size), ("mask_token_id", dd.mask_token_id)):
        if val is None:
            continue
        cur = getattr(cfg.model, name)
        if f"model.{name}" in explicit and cur is not None and cur != val:
            raise TrainerConfigError(
                f"config: --model.{name}: {cur} conflicts with the drafter's {val} in {FLAG} "
                f"{path}; drop --model.{name} or set it to {val}")
        setattr(cfg.model, name, val)
    return validate(cfg)


def load_into(cfg: TrainerConfig, target, drafter) -> None:
    """Check the drafter directory fits ``target``; load its weights into ``drafter``."""
    path = cfg.model.init_from
    dd = read_dflash_dir(path, flag=FLAG)
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
