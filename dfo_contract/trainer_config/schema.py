"""The trainer's config tree: ``kw_only`` dataclasses with defaults and derived values (pure).

Loading, flag overrides and validation are in ``parse``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from . import methods as method_registry
from .methods import DEFAULT_METHOD

ATTENTION_BACKENDS = ("auto", "flex", "sdpa", "flex-eager")
LAYOUTS = ("single", "threads", "ddp")
SCHEDULES = ("cosine", "linear", "constant")
DTYPES = ("auto", "bf16", "fp32", "fp16")
DATA_FORMATS = ("auto", "tokens", "chat")
DDP_GRAD_DTYPES = ("fp32", "bf16")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
EVAL_TARGETS = ("served", "train")

#: a method's settings class (``ModelConfig.settings_of``)
_Settings = TypeVar("_Settings")


def default_gamma(block_size: int) -> float:
    """The loss-decay gamma for a block size: 7 for 16, 5 for 10, 4 for 8 (linear in between)."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    if block_size in table:
        return table[block_size]
    # Same shape as the table (gamma grows ~ with B): interpolate / extrapolate gently.
    return max(1.0, round(block_size * 7.0 / 16.0, 3))


@dataclass(kw_only=True)
class ModelConfig:
    target_path: str = ""                     # HF causal-LM directory (never fetched from a hub)
    drafter_layers: int = 5
    block_size: int = 16
    attention: str = "auto"                   # auto (flex on CUDA, sdpa on CPU) | flex | sdpa | flex-eager
    mask_token_id: int | None = None          # None: the target tokenizer's mask token, if any
    target_layer_ids: list[int] | None = None  # None: round(1 + i*(T-4)/(L-1)), or T//2 for L=1
    gamma: float | None = None                # loss decay; None: 7 (B=16), 5 (B=10), 4 (B=8)
    ce_chunk: int = 2048                      # rows per chunk of the LM-head cross-entropy
    dtype: str = "auto"                       # autocast dtype: auto = bf16 on GPU, fp32 on CPU
    target_fp8: bool = False                  # the frozen target's decoder-layer linears in fp8
    #                                           (e4m3, rowwise scales; opt-in: it changes the
    #                                           features the drafter learns from)
    init_seed: int | None = None              # drafter init seed; None: train.seed
    init_from: str = ""                       # an exported DFlash/DFlash2 drafter dir: its weights,
    #                                           taps, block size, mask token, attention (and DFlash2
    #                                           settings: drafter_dir.effective_config) start the
    #                                           run ("" = off)
    method: str = DEFAULT_METHOD              # dflash | dflash2 (conv + top-k path selector, docs/trainer.md)
    # the draft layers' attention (trainer_config.layers): per layer full_attention |
    # sliding_attention (null: every layer full for dflash, sliding for dflash2 unless the
    # window is 0); is_causal within the block: false every layer bidirectional, true every
    # layer causal, null sliding layers causal and full ones bidirectional
    layer_types: list[str] | None = None
    sliding_window: int = 2048                # the sliding layers' window (0: none)
    is_causal: bool | None = False
    # each registered method's own fields (trainer_config.methods: DFlash2's DFlash2Settings,
    # frozen), by method name; set and written flat (model.conv_kernel_size: ``set_flat``,
    # ``flat``), used only by their method
    method_settings: dict[str, Any] = field(default_factory=method_registry.default_settings)

    def settings(self) -> Any:
        """The chosen method's own settings (None: it has none)."""
        return self.method_settings.get(self.method)

    def settings_of(self, cls: type[_Settings]) -> _Settings:
        """The settings record of the method whose settings class is ``cls`` (DFlash2's
        ``DFlash2Settings``), chosen or not; KeyError when no registered method has ``cls``."""
        return self._own(method_registry.settings_owner(cls))

    # the flat view of the fields, as the YAML and the flags name them: ``model.block_size``
    # is a field of this record, ``model.selector_rank`` one of
    # ``method_settings["dflash2"]`` (a frozen record, replaced on a set)
    def get_flat(self, name: str) -> Any:
        """The value of ``model.<name>``: a field of this record or a method's setting
        (AttributeError for a name neither has)."""
        if name in _OWN_FIELDS:
            return getattr(self, name)
        return getattr(self._own(self._owner(name)), name)

    def set_flat(self, name: str, value: Any) -> None:
        """Set ``model.<name>`` (in place): a field of this record, or a method's setting,
        whose frozen record is replaced by a copy with ``value`` (AttributeError for a name
        neither has)."""
        if name in _OWN_FIELDS:
            setattr(self, name, value)
            return
        c = self._owner(name)
        self.method_settings[c.name] = dataclasses.replace(self._own(c), **{name: value})

    def flat(self) -> dict[str, Any]:
        """The fields as the YAML writes them: the methods' own ones flat, in their place."""
        out = dataclasses.asdict(self)
        own = out.pop("method_settings")
        for c in method_registry.contracts():
            if c.settings is not None:
                out.update(own.get(c.name) or dataclasses.asdict(c.settings()))
        return out

    def _owner(self, name: str) -> method_registry.MethodContract:
        c = method_registry.owner(name)
        if c is None or c.settings is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return c

    def _own(self, c: method_registry.MethodContract) -> Any:
        """Method ``c``'s settings record (its defaults when this config holds none)."""
        own = self.method_settings.get(c.name)
        if own is None and c.settings is not None:
            own = c.settings()
        return own


#: ``ModelConfig``'s flat names that are its own fields (the rest belong to a method)
_OWN_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig)) - {"method_settings"}


@dataclass(kw_only=True)
class DataConfig:
    path: str = ""                            # records file or a `trainer.data tokenize` store dir
    format: str = "auto"                      # auto | tokens (input_ids+loss_mask) | chat (messages/conversations)
    max_seq_len: int = 4096                   # longer samples are truncated
    num_anchors: int = 512                    # max anchors (blocks) per sequence
    seq_buckets: list[int] = field(default_factory=list)     # [] -> [max_seq_len]
    anchor_buckets: list[int] = field(default_factory=list)  # [] -> [num_anchors]
    shuffle: bool = True
    min_loss_tokens: int | None = None        # None: 2 * block_size
    eval_path: str = ""                       # held-out data for eval.* ("" = no eval)
    # packed rows (trainer.data.pack): whole samples laid end to end in rows of pack_tokens
    # tokens and pack_anchors anchors, each attending only inside itself; one shape for every
    # micro-batch (one compile), no padding but each row's tail
    pack: bool = False
    pack_tokens: int | None = None            # tokens per row; None: the largest seq bucket
    pack_anchors: int | None = None           # anchors per row; None: the largest anchor bucket


@dataclass(kw_only=True)
class TrainConfig:
    max_steps: int = 1000
    schedule_steps: int | None = None         # LR-schedule horizon; None: max_steps
    micro_batch: int = 1
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr_ratio: float = 0.0
    warmup_ratio: float = 0.04
    schedule: str = "cosine"
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 1
    heartbeat_s: float = 5.0
    selector_loss_alpha: float = 1.0          # DFlash2: weight of the selector loss (0: unary only, selector frozen)
    selector_warmup_ratio: float = 0.0        # DFlash2: selector weight 0 for this share of the steps,
    selector_ramp_ratio: float = 0.0          #   then rising linearly over this share to the alpha
    selector_stop_gradient: bool = False      # DFlash2: the selector term trains the selector only
    selector_gold_insert: bool = False        # DFlash2: a gold token outside the top-k replaces the
    #                                           weakest candidate (else that slot has no selector term)


@dataclass(kw_only=True)
class EvalConfig:
    every: int = 0                            # measured acceptance length every N steps (0: off)
    # with model.target_fp8: the target evaluation runs on: served (full precision, as the
    # engines serve it; keeps a host-memory copy of the fp8 layers' weights) | train (fp8)
    target: str = "served"
    max_samples: int = 64                     # held-out samples per evaluation (first N of eval_path)
    num_anchors: int | None = None            # blocks per sample; None: data.num_anchors


@dataclass(kw_only=True)
class CheckpointConfig:
    dir: str = ""                             # "" -> <run.dir>/checkpoints
    every: int = 0                            # 0: only at the end (and on SIGTERM)
    keep: int = 3
    save_final: bool = True


@dataclass(kw_only=True)
class ParallelConfig:
    layout: str = "single"
    target_devices: list[str] = field(default_factory=lambda: ["auto"])
    drafter_devices: list[str] = field(default_factory=lambda: ["auto"])
    queue_depth: int = 2                      # threads: feature batches buffered per drafter
    overlap_target: bool = False              # single, one CUDA device: the target's forward of the next
    #                                           micro-batch on a second stream, beside the drafter step
    ddp_bucket_mb: int = 25                   # ddp: gradient bucket size (DDP's bucket_cap_mb)
    ddp_grad_dtype: str = "fp32"              # ddp: all-reduce dtype (bf16 = compression hook)
    warmup_sync_s: int = 0                    # ddp: >0: after the warm-up compile the ranks meet
    #                                           on a gloo barrier with this timeout (s) before the
    #                                           first NCCL collective; 0: no meeting


@dataclass(kw_only=True)
class CompileConfig:
    enabled: bool = True                      # torch.compile the drafter step (layers + loss)
    gate: bool = True                         # the compile gate (trainer.compile.gate)
    mode: str = "default"                     # torch.compile mode for the drafter step
    precompile: bool = False                  # dynamo's precompile cache (trainer.compile.precompile):
    #                                           a warm start loads dynamo's traced code, no re-tracing
    target: bool = False                      # torch.compile the target's decoder layers (regional,
    #                                           warmed and sealed by the gate like the drafter step)
    target_dynamic: bool = False              # with target: the layers compiled with dynamic shapes,
    #                                           one graph for every sequence bucket
    flex_block: int = 0                       # >0: flex attention's kernel BLOCK_M/BLOCK_N (forward)
    #                                           and BLOCK_M1/N1/M2/N2 (backward); 0: torch's choice
    flex_stages: int = 0                      # >0: flex attention's kernel num_stages; 0: torch's
    threads: int = 0                          # >0: inductor's compile threads
    #                                           (TORCHINDUCTOR_COMPILE_THREADS); 0: torch's choice


@dataclass(kw_only=True)
class RunConfig:
    dir: str = ""                             # "" -> $DFO_RUN_DIR or ./run


@dataclass(kw_only=True)
class FaultConfig:
    spec: str | None = None                   # KIND[=ARG]@STEP[#ATTEMPT],...; None: $DFO_FAULT


@dataclass(kw_only=True)
class TrainerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    run: RunConfig = field(default_factory=RunConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        # the keys a file or flag set (``parse._set``); not a field, so never serialized
        self.explicit_keys: set[str] = set()

    # -- the keys as the YAML and the flags name them ---------------------------------------
    def get_key(self, key: str) -> Any:
        """The value of ``SECTION.FIELD`` (``train.lr``; ``model.selector_rank``, a method's
        setting, through ``ModelConfig.get_flat``); AttributeError for an unknown one."""
        section, name = self._section_of(key)
        return section.get_flat(name) if isinstance(section, ModelConfig) else getattr(section, name)

    def set_key(self, key: str, value: Any) -> None:
        """Set ``SECTION.FIELD`` (in place; ``ModelConfig.set_flat`` for ``model``), as is:
        ``parse`` coerces, validates and records it as explicit."""
        section, name = self._section_of(key)
        if isinstance(section, ModelConfig):
            section.set_flat(name, value)
        else:
            setattr(section, name, value)

    def _section_of(self, key: str) -> tuple[Any, str]:
        """(the section record, the field name) of ``SECTION.FIELD``; AttributeError for an
        unknown field (``model``'s flat names are ``ModelConfig.get_flat``'s to check)."""
        sec, name = key.split(".", 1)
        section = getattr(self, sec)
        if not isinstance(section, ModelConfig) and \
                name not in {f.name for f in dataclasses.fields(section)}:
            raise AttributeError(f"{type(section).__name__!r} object has no attribute {name!r}")
        return section, name

    # -- derived values (pure) -------------------------------------------------------------
    def gamma(self) -> float:
        return self.model.gamma if self.model.gamma is not None else default_gamma(self.model.block_size)

    def seq_buckets(self) -> list[int]:
        """The sequence lengths a micro-batch can have: one, the row length, when packed."""
        if self.data.pack:
            return [self.pack_row()[0]]
        return self.eval_seq_buckets()

    def eval_seq_buckets(self) -> list[int]:
        """The sequence buckets held-out evaluation pads to: bucketed even when training packs."""
        return sorted(set(self.data.seq_buckets or [self.data.max_seq_len]))

    def anchor_buckets(self) -> list[int]:
        """The anchor counts a micro-batch can have: one, the row's, when packed."""
        if self.data.pack:
            return [self.pack_row()[1]]
        return sorted(set(self.data.anchor_buckets or [self.data.num_anchors]))

    def pack_row(self) -> tuple[int, int]:
        """(tokens, anchors) of a packed row: ``data.pack_tokens``/``pack_anchors``, else the
        largest sequence and anchor bucket (the largest shape a bucketed batch has)."""
        d = self.data
        tokens = d.pack_tokens or max(d.seq_buckets or [d.max_seq_len])
        anchors = d.pack_anchors or max(d.anchor_buckets or [d.num_anchors])
        return int(tokens), int(anchors)

    def min_loss_tokens(self) -> int:
        m = self.data.min_loss_tokens
        return 2 * self.model.block_size if m is None else m

    def run_dir(self, env_run_dir: str | None = None) -> str:
        """``run.dir``, else ``env_run_dir`` (the trainer passes ``$DFO_RUN_DIR``), else ``run``."""
        return self.run.dir or env_run_dir or "run"

    def checkpoint_dir(self, env_run_dir: str | None = None) -> str:
        return self.checkpoint.dir or os.path.join(self.run_dir(env_run_dir), "checkpoints")

    def schedule_steps(self) -> int:
        return self.train.schedule_steps or self.train.max_steps

    def to_dict(self) -> dict[str, Any]:
        """The nested dict of every field; a method's own fields flat in ``model``, as the
        YAML names them (a config's compile-cache components are unchanged by the nesting)."""
        out = dataclasses.asdict(self)
        out["model"] = self.model.flat()
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
