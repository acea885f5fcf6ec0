"""Loading the trainer's config: YAML + ``--section.field value`` overrides, coercion, validation.

Torch-free: the orchestrator imports this to validate and render run configs.

    cfg = load_config("my-run.yaml", ["--train.micro_batch", "4"])

Every validation error is a ``TrainerConfigError`` whose message names the flag, e.g.
``config: --train.micro_batch: expected a positive integer, got 0``.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Sequence

import yaml

from ..exitcodes import TrainerConfigError
from ..faultspec import parse_spec
from .layers import validate_layers, validate_window
from .methods import contracts, validate_method
from .schema import (ATTENTION_BACKENDS, COMPILE_MODES, DATA_FORMATS, DDP_GRAD_DTYPES, DTYPES,
                     EVAL_TARGETS, LAYOUTS, SCHEDULES, ModelConfig, TrainerConfig)


# --------------------------------------------------------------------------- loading

def _err(flag: str, why: str) -> TrainerConfigError:
    return TrainerConfigError(f"config: --{flag}: {why}")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_types() -> dict[str, Any]:
    """``{"train.micro_batch": int, ...}`` for every settable key."""
    out = {}
    for sec, cls in _hints(TrainerConfig).items():
        for name, tp in _hints(cls).items():
            if cls is ModelConfig and name == "method_settings":
                for c in contracts():   # a method's own fields, flat: model.conv_kernel_size
                    for own, own_tp in (_hints(c.settings) if c.settings else {}).items():
                        out[f"{sec}.{own}"] = own_tp
                continue
            out[f"{sec}.{name}"] = tp
    return out


def _strip_optional(tp) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _coerce(flag: str, tp, value: Any, *, from_text: bool) -> Any:
    """Convert ``value`` (YAML-loaded, or flag text when ``from_text``) to ``tp``."""
    base, optional = _strip_optional(tp)
    if from_text and isinstance(value, str):
        if optional and value.strip().lower() in ("null", "none", "~", ""):
            return None
        if base is float:
            try:
                return float(value)
            except ValueError:
                raise _err(flag, f"expected a number, got {value!r}") from None
        if typing.get_origin(base) is list or base is bool or base is int:
            try:  # "[1, 2]", "1,2", "true", "4" -> YAML scalars/lists
                text = value if not (typing.get_origin(base) is list and "[" not in value) \
                    else "[" + value + "]"
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                raise _err(flag, f"cannot parse {value!r}") from None
    if value is None:
        if optional:
            return None
        raise _err(flag, "must not be null")
    if base is bool:
        if isinstance(value, bool):
            return value
        raise _err(flag, f"expected true or false, got {value!r}")
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(flag, f"expected an integer, got {value!r}")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _err(flag, f"expected a number, got {value!r}")
        return float(value)
    if base is str:
        if isinstance(value, bool | list | dict):
            raise _err(flag, f"expected a string, got {value!r}")
        return str(value)
    if typing.get_origin(base) is list:
        (item_tp,) = typing.get_args(base)
        if not isinstance(value, list):
            value = [value]
        return [_coerce(flag, item_tp, v, from_text=from_text) for v in value]
    raise _err(flag, f"unsupported type {tp}")  # pragma: no cover - table above is complete


def _set(cfg: TrainerConfig, key: str, value: Any, *, from_text: bool, where: str) -> None:
    types_ = field_types()
    if key not in types_:
        sec = key.split(".", 1)[0]
        known = sorted(k for k in types_ if k.startswith(sec + ".")) or sorted(
            {k.split(".")[0] for k in types_})
        raise TrainerConfigError(f"config: {where}unknown key {key!r} (known: {', '.join(known)})")
    cfg.set_key(key, _coerce(key, types_[key], value, from_text=from_text))
    cfg.explicit_keys.add(key)


def _flatten_yaml(data: Any, path: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TrainerConfigError(f"config: {path}: expected a mapping of sections "
                                 f"(model:, data:, train:, ...), got {type(data).__name__}")
    out: dict[str, Any] = {}
    for sec, body in data.items():
        if body is None:
            continue
        if not isinstance(body, dict):
            raise TrainerConfigError(f"config: {path}: section {sec!r} must be a mapping, "
                                     f"got {body!r}")
        for k, v in body.items():
            out[f"{sec}.{k}"] = v
    return out


def split_args(argv: list[str], own: tuple[str, ...]) -> tuple[str | None, dict[str, str], list[str]]:
    """(config path, {own flag: value}, override args) from a trainer command line.

    Shared by ``train`` and ``warmup``. ``--SECTION.FIELD VALUE`` pairs go to the overrides
    whole: a value is data, never read as a flag of ours (``--data.path --resume=/x``).
    """
    config, opts, rest = None, {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if not eq and a.startswith("--") and "." in a and i + 1 < len(argv):
            rest += [a, argv[i + 1]]  # --SECTION.FIELD VALUE: the value is data, never a flag
            i += 2
            continue
        if name in ("--config", *own):
            if not eq:
                if i + 1 >= len(argv):
                    raise TrainerConfigError(f"config: {name}: missing value")
                val, i = argv[i + 1], i + 1
            if name == "--config":
                config = val
            else:
                opts[name] = val
        else:
            rest.append(a)
        i += 1
    return config, opts, rest


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """``["--train.micro_batch", "4", "--model.attention=sdpa"]`` -> [(key, text), ...]."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or "." not in a.split("=", 1)[0]:
            raise TrainerConfigError(f"config: unexpected argument {a!r} "
                                     "(overrides look like --SECTION.FIELD VALUE)")
        if "=" in a:
            k, v = a[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise TrainerConfigError(f"config: --{a[2:]}: missing value")
            k, v = a[2:], args[i + 1]
            i += 2
        out.append((k, v))
    return out


def load_config(path: str | None = None, overrides: Sequence[str] | Sequence[tuple[str, str]] = (),
                *, validate_now: bool = True) -> TrainerConfig:
    """Defaults <- YAML file <- ``--section.field value`` overrides; then validate."""
    cfg = TrainerConfig()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise TrainerConfigError(f"config: --config: file {path} does not exist") from None
        cfg = load_text(text, path)
    return apply_overrides(cfg, overrides, validate_now=validate_now)


def load_text(text: str, path: str) -> TrainerConfig:
    """The defaults <- the YAML ``text`` of the file ``path`` (one parse; not validated)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise TrainerConfigError(f"config: {where}: invalid YAML ({getattr(e, 'problem', e)})") \
            from None
    cfg = TrainerConfig()
    for key, value in _flatten_yaml(data, path).items():
        _set(cfg, key, value, from_text=False, where=f"{path}: ")
    return cfg


def apply_overrides(cfg: TrainerConfig, overrides: Sequence[str] | Sequence[tuple[str, str]] = (),
                    *, validate_now: bool = True) -> TrainerConfig:
    """``cfg`` with ``--section.field value`` overrides (flag args or (key, text) pairs) set
    in place; then validate."""
    texts = [o for o in overrides if isinstance(o, str)]
    pairs = parse_overrides(texts) if texts else [o for o in overrides if isinstance(o, tuple)]
    for key, text in pairs:
        _set(cfg, key, text, from_text=True, where="")
    if validate_now:
        validate(cfg)
    return cfg


def config_from_dict(data: dict) -> TrainerConfig:
    """Rebuild a config from ``to_dict()`` output (e.g. a checkpoint's config.yaml)."""
    return set_values(TrainerConfig(), _flatten_yaml(data, "<dict>"))


def set_values(cfg: TrainerConfig, values: dict[str, Any]) -> TrainerConfig:
    """``cfg`` with the flat ``SECTION.FIELD`` ``values`` (typed, as YAML loads them) set in
    place, each an explicit key."""
    for key, value in values.items():
        _set(cfg, key, value, from_text=False, where="")
    return cfg


# --------------------------------------------------------------------------- validation

def _positive(cfg_val, flag, *, zero_ok=False):
    if not isinstance(cfg_val, int) or cfg_val < (0 if zero_ok else 1):
        kind = "a non-negative integer" if zero_ok else "a positive integer"
        raise _err(flag, f"expected {kind}, got {cfg_val!r}")


def _choice(val, flag, choices):
    if val not in choices:
        raise _err(flag, f"expected one of {', '.join(choices)}, got {val!r}")


def validate(cfg: TrainerConfig) -> TrainerConfig:
    """Check every value; raise ``TrainerConfigError`` naming the first bad flag."""
    m, d, t = cfg.model, cfg.data, cfg.train
    _positive(m.drafter_layers, "model.drafter_layers")
    if not isinstance(m.block_size, int) or m.block_size < 2:
        raise _err("model.block_size", f"expected an integer >= 2, got {m.block_size!r}")
    _choice(m.attention, "model.attention", ATTENTION_BACKENDS)
    _choice(m.dtype, "model.dtype", DTYPES)
    if m.mask_token_id is not None and m.mask_token_id < 0:
        raise _err("model.mask_token_id", f"expected a token id >= 0, got {m.mask_token_id}")
    if m.target_layer_ids is not None:
        ids = m.target_layer_ids
        if not ids:
            raise _err("model.target_layer_ids", "expected a non-empty list of layer ids")
        if any(i < 0 for i in ids):
            raise _err("model.target_layer_ids", f"layer ids must be >= 0, got {ids}")
        if len(set(ids)) != len(ids):
            raise _err("model.target_layer_ids", f"duplicate layer ids in {ids}")
    if m.gamma is not None and not m.gamma > 0:
        raise _err("model.gamma", f"expected a positive number, got {m.gamma}")
    _positive(m.ce_chunk, "model.ce_chunk")
    validate_layers(m, _err)
    validate_window(m, _err)

    if not d.path:
        raise _err("data.path", "required: a .jsonl, .jsonl.gz or .parquet file (tokenized or "
                                "chat records) or a store from python -m trainer.data tokenize")
    _choice(d.format, "data.format", DATA_FORMATS)
    _positive(d.max_seq_len, "data.max_seq_len")
    _positive(d.num_anchors, "data.num_anchors")
    if d.max_seq_len < 2 * m.block_size:
        raise _err("data.max_seq_len", f"must be >= 2 * model.block_size "
                                       f"({2 * m.block_size}), got {d.max_seq_len}")
    for b in d.seq_buckets:
        _positive(b, "data.seq_buckets")
        if b < 2 * m.block_size:
            raise _err("data.seq_buckets", f"bucket {b} < 2 * model.block_size")
    for b in d.anchor_buckets:
        _positive(b, "data.anchor_buckets")
    if d.seq_buckets and max(d.seq_buckets) < d.max_seq_len:
        raise _err("data.seq_buckets", f"largest bucket {max(d.seq_buckets)} must be >= "
                                       f"data.max_seq_len ({d.max_seq_len})")
    if d.anchor_buckets and max(d.anchor_buckets) < d.num_anchors:
        raise _err("data.anchor_buckets", f"largest bucket {max(d.anchor_buckets)} must be >= "
                                          f"data.num_anchors ({d.num_anchors})")
    if d.min_loss_tokens is not None:
        _positive(d.min_loss_tokens, "data.min_loss_tokens")
    if d.pack_tokens is not None:
        _positive(d.pack_tokens, "data.pack_tokens")
        if d.pack_tokens < d.max_seq_len:
            raise _err("data.pack_tokens", f"{d.pack_tokens} < data.max_seq_len "
                                           f"({d.max_seq_len}): a row must hold the longest sample")
    if d.pack_anchors is not None:
        _positive(d.pack_anchors, "data.pack_anchors")
        if d.pack_anchors < d.num_anchors:
            raise _err("data.pack_anchors", f"{d.pack_anchors} < data.num_anchors "
                                            f"({d.num_anchors}): a row must hold a sample's anchors")

    _positive(t.max_steps, "train.max_steps")
    if t.schedule_steps is not None:
        _positive(t.schedule_steps, "train.schedule_steps")
    _positive(t.micro_batch, "train.micro_batch")
    _positive(t.grad_accum, "train.grad_accum")
    _positive(t.log_every, "train.log_every")
    if not t.lr > 0:
        raise _err("train.lr", f"expected a positive number, got {t.lr}")
    if not 0 <= t.warmup_ratio < 1:
        raise _err("train.warmup_ratio", f"expected a number in [0, 1), got {t.warmup_ratio}")
    if not 0 <= t.min_lr_ratio <= 1:
        raise _err("train.min_lr_ratio", f"expected a number in [0, 1], got {t.min_lr_ratio}")
    _choice(t.schedule, "train.schedule", SCHEDULES)
    _choice(cfg.eval.target, "eval.target", EVAL_TARGETS)
    if t.weight_decay < 0:
        raise _err("train.weight_decay", f"expected a number >= 0, got {t.weight_decay}")
    for name in ("beta1", "beta2"):
        v = getattr(t, name)
        if not 0 <= v < 1:
            raise _err(f"train.{name}", f"expected a number in [0, 1), got {v}")
    if t.grad_clip < 0:
        raise _err("train.grad_clip", f"expected a number >= 0 (0 = off), got {t.grad_clip}")
    if not 0 < t.heartbeat_s <= 10:
        raise _err("train.heartbeat_s", f"expected a number in (0, 10], got {t.heartbeat_s}")

    _positive(cfg.checkpoint.every, "checkpoint.every", zero_ok=True)
    _positive(cfg.checkpoint.keep, "checkpoint.keep")

    _choice(cfg.compile.mode, "compile.mode", COMPILE_MODES)
    if cfg.compile.flex_block not in (0, 16, 32, 64, 128):
        raise _err("compile.flex_block", "expected 0 (torch's choice) or 16, 32, 64 or 128 "
                   f"(a divisor of flex's 128-token block), got {cfg.compile.flex_block!r}")
    _positive(cfg.compile.flex_stages, "compile.flex_stages", zero_ok=True)
    _positive(cfg.compile.threads, "compile.threads", zero_ok=True)
    _positive(cfg.parallel.warmup_sync_s, "parallel.warmup_sync_s", zero_ok=True)
    p = cfg.parallel
    _choice(p.layout, "parallel.layout", LAYOUTS)
    _positive(p.queue_depth, "parallel.queue_depth")
    _positive(p.ddp_bucket_mb, "parallel.ddp_bucket_mb")
    _choice(p.ddp_grad_dtype, "parallel.ddp_grad_dtype", DDP_GRAD_DTYPES)
    for flag, devs in (("parallel.target_devices", p.target_devices),
                       ("parallel.drafter_devices", p.drafter_devices)):
        if not devs:
            raise _err(flag, "expected a non-empty list of devices, e.g. [cuda:0] or [cpu]")
        for dv in devs:
            if not (dv in ("auto", "cpu", "cuda") or (dv.startswith("cuda:") and dv[5:].isdigit())):
                raise _err(flag, f"expected devices like cpu, cuda, cuda:0 or auto, got {dv!r}")
    if p.layout == "single" and (len(p.target_devices) != 1 or len(p.drafter_devices) != 1):
        raise _err("parallel.layout", "single uses one device: give one entry in "
                                      "parallel.target_devices and parallel.drafter_devices")
    on_cpu = all(d == "cpu" for d in p.drafter_devices)
    if p.layout == "ddp" and p.ddp_grad_dtype == "bf16" and on_cpu:
        raise _err("parallel.ddp_grad_dtype", "bf16 gradients need NCCL (ddp on GPU); use fp32 "
                                              "with gloo on CPU")
    validate_method(cfg, _err)
    if cfg.fault.spec:
        parse_spec(cfg.fault.spec)  # FaultSpecError is a TrainerConfigError naming --fault.spec
    return cfg
