"""Fallback ladders: what to change before the next attempt, per failure class. Pure.

A *step* is a pure function ``(config, overrides) -> new overrides | None``:
``config`` is the effective run config as flat dotted keys (``{"train.micro_batch": 8, ...}``,
overrides already applied), ``overrides`` the dotted overrides now in force. A step returns
the new overrides, or ``None`` when it cannot change anything (the gate is already on, the
micro-batch is already 1): the ladder then moves on to its next step.

A *ladder* is a list of step names per class. A name ending in ``*`` repeats while it still
changes the config (``halve_micro_batch*`` halves down to 1). A class is *transient* when,
its ladder spent, it may still restart with the same config (until its budget is spent);
otherwise a spent ladder ends the run ``failed``.

Ladders come from the defaults (each class's row in ``dfo_contract.failure_classes``), then
hosts.yaml ``fallbacks:``, then the run's ``--fallbacks`` (each replacing whole classes), and
are validated by :func:`validate_ladders`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dfo_contract.failure_classes import FAILURE_CLASSES, TABLES

from .errors import ConfigError

Config = Mapping[str, Any]
Overrides = dict[str, Any]
StepFn = Callable[[Config, Overrides], "Overrides | None"]


def _set(ov: Overrides, cfg: Config, key: str, value: Any) -> Overrides | None:
    if cfg.get(key) == value:
        return None
    new = dict(ov)
    new[key] = value
    return new


def compile_gate(cfg: Config, ov: Overrides) -> Overrides | None:
    """Compile gate on: warm every shape sequentially, then hold a lock around compiled calls.
    The supervisor also restores the compile cache from its snapshot before the attempt.
    Nothing when the run does not compile (``compile.enabled: false`` and no
    ``compile.target``): the gate would change the config but not the run."""
    if cfg.get("compile.enabled") is False and cfg.get("compile.target") is not True:
        return None
    return _set(ov, cfg, "compile.gate", True)


def target_compile_off(cfg: Config, ov: Overrides) -> Overrides | None:
    """The target's decoder layers eager again (``compile.target: false``): the first thing a
    compile failure gives up, before the drafter's compile is touched. Nothing when the target
    is not compiled."""
    if cfg.get("compile.target") is not True:
        return None
    return _set(ov, cfg, "compile.target", False)


def layout_ddp(cfg: Config, ov: Overrides) -> Overrides | None:
    """One process per GPU (torchrun) instead of drafter threads."""
    return _set(ov, cfg, "parallel.layout", "ddp")


def one_drafter_device(cfg: Config, ov: Overrides) -> Overrides | None:
    """Keep only the first drafter device (no concurrent compiles)."""
    devs = cfg.get("parallel.drafter_devices")
    if not isinstance(devs, (list, tuple)) or len(devs) <= 1:
        return None
    return _set(ov, cfg, "parallel.drafter_devices", [devs[0]])


def attention_sdpa(cfg: Config, ov: Overrides) -> Overrides | None:
    """SDPA attention: no flex, no compile of the attention kernel."""
    return _set(ov, cfg, "model.attention", "sdpa")


def _halve(key: str) -> StepFn:
    def step(cfg: Config, ov: Overrides) -> Overrides | None:
        v = cfg.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 1:
            return None
        return _set(ov, cfg, key, v // 2)
    step.__doc__ = f"Halve {key} (down to 1)."
    return step


halve_micro_batch = _halve("train.micro_batch")
halve_anchors = _halve("data.num_anchors")


def halve_lr(cfg: Config, ov: Overrides) -> Overrides | None:
    """Halve the learning rate."""
    lr = cfg.get("train.lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        return None
    return _set(ov, cfg, "train.lr", float(lr) / 2)


#: flex attention's kernel blocks, largest first (each divides flex's 128-token sparse block)
FLEX_BLOCKS = (64, 32, 16)


def flex_smaller_blocks(cfg: Config, ov: Overrides) -> Overrides | None:
    """Compile flex attention with smaller kernel blocks and one pipeline stage
    (``compile.flex_block``, ``compile.flex_stages``: the trainer passes them as flex's
    ``kernel_options``, forward and backward): 64, then 32, then 16. Nothing when flex is not
    compiled or the blocks are already the smallest."""
    if cfg.get("model.attention", "auto") not in ("auto", "flex"):   # auto: flex on CUDA
        return None
    cur = cfg.get("compile.flex_block") or 0
    smaller = [b for b in FLEX_BLOCKS if not cur or b < cur]
    if not smaller:
        return None
    new = _set(ov, cfg, "compile.flex_block", smaller[0])
    if new is None:  # already that block
        return None
    return _set(new, {**cfg, **new}, "compile.flex_stages", 1) or new


def compile_threads_one(cfg: Config, ov: Overrides) -> Overrides | None:
    """Compile in the trainer's own process, no worker pool (``compile.threads=1``: the
    attempt runs with ``TORCHINDUCTOR_COMPILE_THREADS=1``)."""
    return _set(ov, cfg, "compile.threads", 1)


#: the first collective's timeout after ``warmup_sync``: long enough for a cold compile
WARMUP_SYNC_S = 1800


def warmup_sync(cfg: Config, ov: Overrides) -> Overrides | None:
    """ddp: every rank finishes its warm-up compile, then the ranks meet once on the CPU
    (a gloo barrier with a ``parallel.warmup_sync_s`` timeout) before the first NCCL
    collective, so no rank waits in an all-reduce while another still compiles. Nothing when
    the run is not ddp."""
    if cfg.get("parallel.layout") != "ddp":
        return None
    return _set(ov, cfg, "parallel.warmup_sync_s", WARMUP_SYNC_S)


def same(cfg: Config, ov: Overrides) -> Overrides | None:
    """Restart with the same config."""
    return dict(ov)


STEPS: dict[str, StepFn] = {
    "target_compile_off": target_compile_off,
    "compile_gate": compile_gate,
    "layout_ddp": layout_ddp,
    "one_drafter_device": one_drafter_device,
    "attention_sdpa": attention_sdpa,
    "halve_micro_batch": halve_micro_batch,
    "halve_anchors": halve_anchors,
    "halve_lr": halve_lr,
    "flex_smaller_blocks": flex_smaller_blocks,
    "compile_threads_one": compile_threads_one,
    "warmup_sync": warmup_sync,
    "same": same,
}

#: steps after which the supervisor restores the compile cache from its snapshot
RESTORES_CACHE = frozenset({"compile_gate"})

#: each failure class's default ladder (its row's ``ladder``)
DEFAULT_LADDERS: dict[str, list[str]] = {c: list(steps) for c, steps in TABLES.ladders.items()}

#: classes that restart with the same config once their ladder is spent
TRANSIENT = TABLES.transient


def validate_ladders(raw: Any, *, source: str = "fallbacks") -> dict[str, list[str]]:
    """Check a ``fallbacks:`` mapping (class -> list of step names); ConfigError names the
    bad key and the valid choices."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping of failure class -> list of steps, "
                          f"got {type(raw).__name__}")
    out: dict[str, list[str]] = {}
    for cls, steps in raw.items():
        if cls not in FAILURE_CLASSES:
            raise ConfigError(f"{source}: unknown failure class {cls!r}",
                              hint="choose from " + ", ".join(FAILURE_CLASSES))
        if isinstance(steps, str):
            steps = [s.strip() for s in steps.split(",") if s.strip()]
        if not isinstance(steps, (list, tuple)):
            raise ConfigError(f"{source}.{cls}: expected a list of step names")
        for s in steps:
            if not isinstance(s, str) or s.rstrip("*") not in STEPS:
                raise ConfigError(f"{source}.{cls}: unknown fallback step {s!r}",
                                  hint="choose from " + ", ".join(STEPS))
        out[cls] = list(steps)
    return out


def merge_ladders(*layers: Mapping[str, list[str]] | None) -> dict[str, list[str]]:
    """Defaults, then each layer replacing whole classes."""
    out = {k: list(v) for k, v in DEFAULT_LADDERS.items()}
    for layer in layers:
        for k, v in (layer or {}).items():
            out[k] = list(v)
    return out


@dataclass(frozen=True)
class Choice:
    """The next config for a class: ``step`` is None when restarting with the same config."""

    cls: str
    step: str | None
    overrides: Overrides
    position: int                  # ladder position to store for next time
    changed: dict[str, Any]        # the keys this step set
    restore_cache: bool = False
    exhausted: bool = False        # ladder spent and class not transient: give up
    spent: str = ""                # the ladder, for the give-up reason


    def to_json(self) -> dict:
        return {"class": self.cls, "step": self.step, "position": self.position,
                "changed": self.changed, "restore_cache": self.restore_cache,
                "exhausted": self.exhausted}


def next_config(cls: str, ladder: list[str], position: int, base: Config,
                overrides: Overrides) -> Choice:
    """Pick the first step at or after ``position`` that changes the effective config.

    ``base`` is the run config without overrides (flat dotted keys); the effective config
    is ``base`` updated with ``overrides``.
    """
    pos = position
    while pos < len(ladder):
        name = ladder[pos]
        repeat = name.endswith("*")
        fn = STEPS[name.rstrip("*")]
        cfg = {**base, **overrides}
        new = fn(cfg, overrides)
        if new is not None:
            changed = {k: v for k, v in new.items() if overrides.get(k, _MISSING) != v}
            next_pos = pos if repeat else pos + 1
            if name.rstrip("*") == "same" or changed:
                return Choice(cls, name.rstrip("*"), new, next_pos, changed,
                              restore_cache=name.rstrip("*") in RESTORES_CACHE)
        pos += 1
    spent = " -> ".join(ladder) or "empty"
    if cls in TRANSIENT:
        return Choice(cls, None, dict(overrides), pos, {}, spent=spent)
    return Choice(cls, None, dict(overrides), pos, {}, exhausted=True, spent=spent)


_MISSING = object()


def describe(ladders: Mapping[str, list[str]]) -> list[tuple[str, str]]:
    """(class, 'step -> step -> ...') rows for plans and docs."""
    rows = []
    for cls in FAILURE_CLASSES:
        steps = ladders.get(cls, [])
        tail = "restart with the same config" if cls in TRANSIENT else "give up (failed)"
        rows.append((cls, " -> ".join(list(steps) + [tail])))
    return rows
