"""``model.init_from``: fine-tune a released drafter: DFlash (dfo's export or z-lab's layout) or
DFlash2 (the layout SGLang and vLLM load, which dfo's DFlash2 export writes).

``resolve(cfg)`` runs before anything is built: it reads the directory
(``model.dflash_dir``: config.json, the weights' files and names) and takes the drafter's
settings with ``dfo_contract.trainer_config.drafter_dir.effective_config``, the function
``dfo launch`` and ``dfo warm-cache`` apply to the same config.json to validate the run and
key its compile cache: the drafter layers, tapped target layers, block size and mask token,
for DFlash2 the ``dflash_config`` fields (conv kernel/group size, selector rank/top-k, logit
cap, output multiplier), and for both methods the layers' attention as the directory
declares it: ``layer_types``, ``sliding_window`` and ``is_causal`` (absent: sliding layers
causal, full ones bidirectional, the rule z-lab's class applies). A drafter with parts dfo
cannot train (attention sinks, a separate mask embedding, an input embedding scale other
than 1, another layer type) is refused in one line naming the part. A setting given in the
config file or a flag that differs from the drafter's is a one-line error naming the flag;
an unset one takes the drafter's value (the checkpoints' config.yaml then records it). The
method is never taken from the directory: a DFlash2 drafter needs ``model.method: dflash2``
and a DFlash one ``dflash``, else one line names the flag.

``load_into(cfg, target, drafter)`` runs once the target is loaded and the drafter built:
a drafter made for another target (hidden size, vocabulary, layer count) is refused in one
line; then the weights are loaded strictly (every name, every shape). Nothing else is taken
from the directory: no optimizer state, no step, no data position; a resumed run's
checkpoint still wins over these weights.
"""

from __future__ import annotations

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_config.drafter_dir import FLAG, check_method, effective_config

from ..model.dflash_dir import load_weights, read_dflash_dir


def resolve(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with the drafter's taps, block size, mask token, layer count, attention and,
    for DFlash2, its method fields (in place)."""
    if not cfg.model.init_from:
        return cfg
    dd = read_dflash_dir(cfg.model.init_from, flag=FLAG)
    return effective_config(cfg, dd.config)


def load_into(cfg: TrainerConfig, target, drafter) -> None:
    """Check the drafter directory fits ``target``; load its weights into ``drafter``."""
    path = cfg.model.init_from
    dd = read_dflash_dir(path, flag=FLAG)
    d = dd.drafter
    check_method(cfg, d.method, path)
    have = {"hidden size": int(target.config.hidden_size), "vocabulary": int(target.vocab_size),
            "layer count": int(target.num_layers_total)}
    want = {"hidden size": d.hidden_size, "vocabulary": d.vocab_size,
            "layer count": d.num_target_layers}
    for what, v in want.items():
        if v is not None and v != have[what]:
            raise TrainerConfigError(
                f"config: {FLAG}: {path} is a drafter for a target with {what} {v}, but "
                f"{cfg.model.target_path} has {have[what]}; give a drafter made for this target")
    try:
        drafter.load_trainable_state_dict({k: v.float() for k, v in load_weights(dd).items()})
    except KeyError as e:
        raise TrainerConfigError(f"config: {FLAG}: {path}: {e.args[0]}") from None
