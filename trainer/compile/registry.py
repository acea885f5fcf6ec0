"""The ONE place where torch.compile is applied, once per process per function.

- ``flex_attention(...)``: ``torch.compile(flex_attention, dynamic=False)``, created once
  (under a lock) and called through the call guard. Shapes are bucketed
  (``step.shape_buckets``), so the set of compiled shapes is finite.
- ``compiled(name, fn)``: any other function compiled once per process (the drafter step
  when ``compile.enabled``), also called through ``call(...)`` -> the guard.
- Block masks are NOT compiled: ``torch.compile(create_block_mask)`` with a mask_mod that
  indexes a captured anchor tensor stalled > 280 s on an H200 at Q=8192, KV=11264.
  ``trainer.model.attention.flex_block_mask`` builds the BlockMask analytically instead
  (plain tensor ops, O(b * Tq * KV/128)).

The guard hook: ``set_call_guard(ctx_factory)`` makes every call into compiled code run
inside ``ctx_factory(what)`` (a context manager; ``what`` names the callee). The compile
gate (trainer.compile.gate) installs its process-wide lock this way. ``None`` removes it.

The registry, probes and guard are the process's ``trainer.runtime.get().compile``.

Cache settings (``cache_settings()``, applied by ``apply_cache_settings()`` in every thread
that compiles, once per thread, gate on or off alike -- they are part of the FX-graph and
AOT-autograd cache keys, so every process and thread of every attempt must use the same):
the drafter step's joint graph holds ``torch.autocast(enabled=False)`` regions (RoPE, the
chunked CE) and a custom ``autograd.Function`` (the CE), and AOT-autograd's cache BYPASSES
any graph with either by default (``autograd_cache_bypass``: "Unsupported call_function
target _enter_autocast", then "... autograd_function_apply"), re-tracing and re-partitioning
the joint graph on every start even when every inductor graph hits. Both are pure here
(autocast's arguments are constants in the graph; the Function's forward and backward are
traced into it), so they are marked cacheable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from typing import Callable, ContextManager

from dfo_contract.fsio import atomic_write_text, sha256_file

from .. import runtime

log = logging.getLogger("dfo")


#: torch functions in the drafter step's graph that AOT-autograd's cache refuses by default
#: (the higher-order forms are what some torch versions trace the same regions into)
CACHEABLE_FUNCTIONS = ("torch.amp.autocast_mode._enter_autocast",
                       "torch.amp.autocast_mode._exit_autocast",
                       "torch.ops.higher_order.wrap_with_autocast",
                       "torch.ops.higher_order.wrap_with_set_grad_enabled")
_tl = threading.local()
#: ``compile.precompile`` for this process (set by ``configure``, read by every compiling thread)
_precompile = {"on": False}


def cache_settings() -> dict[str, object]:
    """What ``apply_cache_settings`` sets (for reports): config name -> value."""
    import torch

    return {**({"torch._dynamo.config.caching_precompile": True} if _precompile["on"] else {}),
            "torch._functorch.config.autograd_cache_allow_custom_autograd_functions": True,
            "torch._inductor.config.unsafe_marked_cacheable_functions":
                {f: torch.__version__ for f in CACHEABLE_FUNCTIONS}}


def apply_cache_settings(force: bool = False) -> None:
    """Make the drafter step's joint graph cacheable by AOT-autograd, in the CALLING thread.

    Once per thread (config writes are per-thread on torch >= 2.12); a no-op where torch
    lacks the settings. Called by ``compiled``/``guard`` (so every compiling thread has it)
    and by the gate's ``thread_setup`` in both gate modes.
    """
    if getattr(_tl, "cache_settings", False) and not force:
        return
    import torch
    import torch._functorch.config as fcfg
    import torch._inductor.config as icfg

    if hasattr(fcfg, "autograd_cache_allow_custom_autograd_functions"):
        fcfg.autograd_cache_allow_custom_autograd_functions = True
    if _precompile["on"]:
        import torch._dynamo.config as dcfg

        if hasattr(dcfg, "caching_precompile"):
            dcfg.caching_precompile = True
    if hasattr(icfg, "unsafe_marked_cacheable_functions"):
        marked = dict(icfg.unsafe_marked_cacheable_functions or {})
        want = {f: torch.__version__ for f in CACHEABLE_FUNCTIONS}
        if any(marked.get(k) != v for k, v in want.items()):
            marked.update(want)
            icfg.unsafe_marked_cacheable_functions = marked
    _tl.cache_settings = True


def configure(precompile: bool) -> None:
    """Apply the compile section's process-wide switches (``compile.precompile``) before
    anything is compiled; the calling thread gets them at once, other threads on their first
    compile (``apply_cache_settings``)."""
    _precompile["on"] = bool(precompile)
    apply_cache_settings(force=True)


def _state() -> runtime.CompileState:
    return runtime.get().compile


def set_call_guard(ctx_factory: Callable[[str], ContextManager] | None) -> None:
    """Wrap every call into compiled code in ``ctx_factory(what)`` (None: no wrapper)."""
    _state().guard_factory = ctx_factory


def guard(what: str) -> ContextManager:
    apply_cache_settings()
    f = _state().guard_factory
    return f(what) if f is not None else contextlib.nullcontext()


def compiled(name: str, fn: Callable, **options) -> Callable:
    """``torch.compile(fn, dynamic=False, **options)`` created once per process under ``name``."""
    apply_cache_settings()
    st = _state()
    with st.lock:
        c = st.compiled.get(name)
        if c is None:
            import torch

            options.setdefault("dynamic", False)
            c = torch.compile(fn, **options)
            st.compiled[name] = c
        return c


def call(name: str, fn: Callable, *args, **kwargs):
    """Call the compiled version of ``fn`` (compiled on first use) inside the guard."""
    c = compiled(name, fn)
    with guard(name):
        return c(*args, **kwargs)


def compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention as _flex

    return compiled("flex_attention", _flex)


def flex_attention(q, k, v, block_mask, *, enable_gqa: bool = False, scale: float | None = None):
    """Compiled flex_attention (never the dense eager path), called through the guard."""
    fn = compiled_flex_attention()
    with guard("flex_attention"):
        return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale)


def names() -> list[str]:
    """Names of the functions compiled so far in this process."""
    st = _state()
    with st.lock:
        return sorted(st.compiled)


def probe_call(device: str = "cpu") -> Callable[[], object] | None:
    """A zero-argument callable entering compiled flex_attention (fault injection's fx_race).

    None when flex_attention has not been compiled in this process. Built once per device;
    the probe's tiny shape may itself need a compile (it is called only by fault injection).
    """
    st = _state()
    with st.lock:
        fn = st.compiled.get("flex_attention")
        probe = st.probes.get(str(device))
    if fn is None:
        return None
    if probe is not None:
        return probe
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    q = torch.zeros(1, 1, 128, 16, device=device)
    bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 128, 128, device=device)

    def _call():
        with torch.no_grad(), guard("flex_attention"):
            return fn(q, q, q, block_mask=bm)
    with st.lock:
        st.probes[str(device)] = _call
    return _call


# ------------------------------------------------- dynamo's precompile cache (compile.precompile)
#
# With ``torch._dynamo.config.caching_precompile`` torch keeps, per compiled function,
# ``<inductor cache dir>/dynamo/<source id>/entry``: a pickle of dynamo's traced bytecode,
# guards and the compiled backends. A warm start loads it instead of re-tracing. It lives in
# TORCHINDUCTOR_CACHE_DIR, i.e. under ``inductor/`` of the per-run cache dir dfo snapshots,
# so a snapshot carries it. torch writes the entry by rename, but it only refuses an entry
# that fails to unpickle: dfo writes ``entry.sha256`` beside every entry it saved (after the
# entry is complete) and, before anything compiles, removes every entry directory whose
# entry is missing its checksum file or differs from it (truncated, half-copied, altered,
# or written by something else), so such an entry is never loaded.

PRECOMPILE_ENTRY = "entry"
PRECOMPILE_SUM = "entry.sha256"


@dataclass
class PrecompileCheck:
    """What ``verify_precompile_entries`` found: entries kept, entries removed (and why)."""
    dir: str
    kept: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)


def precompile_dir() -> str:
    """``<TORCHINDUCTOR_CACHE_DIR>/dynamo``: where torch's DynamoCache reads and writes."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "dynamo")


def verify_precompile_entries(root: str | None = None) -> PrecompileCheck:
    """Remove every precompile entry that is not complete and checksummed (before compiling)."""
    root = root or precompile_dir()
    chk = PrecompileCheck(dir=root)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return chk
    for name in names:
        d = os.path.join(root, name)
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        why = _entry_problem(d)
        if why is None:
            chk.kept.append(name)
            continue
        chk.dropped[name] = why
        shutil.rmtree(d, ignore_errors=True)
        log.warning("compile.precompile: dropped cache entry %s: %s", name, why)
    return chk


def _entry_problem(d: str) -> str | None:
    entry, sumf = os.path.join(d, PRECOMPILE_ENTRY), os.path.join(d, PRECOMPILE_SUM)
    if not os.path.isfile(entry) or os.path.islink(entry):
        return "no entry file"
    try:
        with open(sumf, encoding="ascii") as f:
            want = f.read().split()
    except (OSError, UnicodeDecodeError):
        return "no checksum file (half-written or not saved by dfo)"
    got = [sha256_file(entry), str(os.path.getsize(entry))]
    return None if want == got else "entry differs from its checksum (truncated or altered)"


def save_precompile_entries() -> dict[str, object]:
    """Write this process's precompile entries (torch's atomic write), then their checksums.

    Call after the warm-up ran every compiled function (and after
    ``torch.compiler.save_cache_artifacts``, which rewrites the same entries)."""
    if not _precompile["on"]:
        return {"saved": [], "why": "compile.precompile is off"}
    from torch._dynamo.package import DynamoCache
    from torch._dynamo.precompile_context import PrecompileContext

    entries, _ = PrecompileContext.create_cache_entries()
    root = precompile_dir()
    saved, failed = [], {}
    for key, entry in entries.items():
        d = os.path.join(root, key)
        sumf = os.path.join(d, PRECOMPILE_SUM)
        try:
            if os.path.exists(sumf):
                os.unlink(sumf)  # never a checksum beside an entry being rewritten
            DynamoCache.write(entry, key)
            path = os.path.join(d, PRECOMPILE_ENTRY)
            atomic_write_text(sumf, f"{sha256_file(path)} {os.path.getsize(path)}\n")
            saved.append(key)
        except Exception as e:  # noqa: BLE001 - e.g. a guard torch cannot serialize: no entry
            failed[key] = f"{type(e).__name__}: {e}"[:300]
            log.warning("compile.precompile: could not save entry %s: %s", key, failed[key])
    return {"dir": root, "saved": saved, "failed": failed}
