"""The ONE place where torch.compile is applied, once per process per function.

- ``CompileRegistry.flex_attention(...)``: ``torch.compile(flex_attention, dynamic=False)``, created once
  (under a lock) and called through the call guard. Shapes are bucketed
  (``step.shape_buckets``), so the set of compiled shapes is finite.
- ``CompileRegistry.compiled(name, fn)``: any other function compiled once per process (the drafter step
  when ``compile.enabled``), also called through ``call(...)`` -> the guard. ``variant``
  names a function's compiled variant (mode; dynamic shapes: one graph for every shape).
- Block masks are NOT compiled: ``torch.compile(create_block_mask)`` with a mask_mod that
  indexes a captured anchor tensor stalled > 280 s on an H200 at Q=8192, KV=11264.
  ``trainer.model.attention.flex_block_mask`` builds the BlockMask analytically instead
  (plain tensor ops, O(b * Tq * KV/128)).

The guard hook: ``set_call_guard(ctx_factory)`` makes every call into compiled code run
inside ``ctx_factory(what)`` (a context manager; ``what`` names the callee). The compile
gate (trainer.compile.gate) installs its process-wide lock this way (``install_gate``).
``None`` removes it.

All of it is a ``CompileRegistry`` object: one per process, as torch.compile's own caches
are, built by the entry point (trainer.core.runtime.Runtime) and passed to what compiles.
Every compiling thread gets the cache settings first (trainer.compile.settings).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, ContextManager

from .settings import CacheSettings


def variant(base: str, mode: str = "default", dynamic: bool = False) -> tuple[str, dict]:
    """The registry name and ``torch.compile`` options of ``base`` compiled in ``mode``,
    with dynamic shapes or not: ``base``, ``base[max-autotune]``, ``base[dynamic]``, ..."""
    tags = ([] if mode == "default" else [mode]) + (["dynamic"] if dynamic else [])
    opts: dict = ({} if mode == "default" else {"mode": mode}) | ({"dynamic": True} if dynamic else {})
    return (f"{base}[{', '.join(tags)}]" if tags else base), opts


def flex_kernel_options(block: int, stages: int) -> dict[str, int] | None:
    """flex attention's ``kernel_options`` for ``compile.flex_block``/``compile.flex_stages``
    (0: torch's choice). The ``fwd_``/``bwd_`` prefixes address the forward and the backward
    kernel (torch/_inductor/kernel/flex/flex_attention.py strips them per kernel)."""
    opts: dict[str, int] = {}
    if block:
        opts.update(fwd_BLOCK_M=block, fwd_BLOCK_N=block, bwd_BLOCK_M1=block,
                    bwd_BLOCK_N1=block, bwd_BLOCK_M2=block, bwd_BLOCK_N2=block)
    if stages:
        opts.update(fwd_num_stages=stages, bwd_num_stages=stages)
    return opts or None


class CompileRegistry:
    """The functions compiled so far, fx_race probes, the call guard and flex's kernel
    options: one per process (trainer.core.runtime.Runtime holds it), as torch.compile's own
    caches are."""

    #: torch.compile's code generator. Dynamo traces, guards and recompiles the same whatever
    #: generates the code, so a test counting compiles may set ``aot_eager`` (no inductor codegen)
    backend: str = "inductor"

    def __init__(self):
        self._lock = threading.Lock()
        self._compiled: dict[str, Callable] = {}
        self._probes: dict[str, Callable[[], object]] = {}
        self._guard_factory: Callable[[str], ContextManager] | None = None
        #: flex attention's ``kernel_options`` (``compile.flex_block``/``flex_stages``); None: torch's
        self.flex_kernel_options: dict[str, int] | None = None
        #: the compile gate whose guard wraps every call (``install_gate``); None: no gate
        self.gate = None
        #: the cache settings every compiling thread applies first
        self.cache = CacheSettings()

    def set_call_guard(self, ctx_factory: Callable[[str], ContextManager] | None) -> None:
        """Wrap every call into compiled code in ``ctx_factory(what)`` (None: no wrapper)."""
        self._guard_factory = ctx_factory

    def install_gate(self, gate):
        """Route every call into compiled code through ``gate`` (a
        trainer.compile.gate.CompileGate; its guard only when it is enabled); returns it."""
        self.gate = gate
        self.set_call_guard(gate.guard if gate.enabled else None)
        return gate

    def guard(self, what: str) -> ContextManager:
        self.cache.apply()
        f = self._guard_factory
        return f(what) if f is not None else contextlib.nullcontext()

    def compiled(self, name: str, fn: Callable, **options) -> Callable:
        """``torch.compile(fn, dynamic=False, **options)`` created once under ``name``."""
        self.cache.apply()
        with self._lock:
            c = self._compiled.get(name)
            if c is None:
                import torch

                options.setdefault("dynamic", False)
                c = torch.compile(fn, backend=self.backend, **options)
                self._compiled[name] = c
            return c

    def call(self, name: str, fn: Callable, *args, **kwargs):
        """Call the compiled version of ``fn`` (compiled on first use) inside the guard."""
        c = self.compiled(name, fn)
        with self.guard(name):
            return c(*args, **kwargs)

    def compiled_flex_attention(self) -> Callable:
        from torch.nn.attention.flex_attention import flex_attention as _flex

        return self.compiled("flex_attention", _flex)

    def set_flex_kernel_options(self, opts: dict[str, int] | None) -> None:
        """Every later flex_attention call through this registry compiles with ``opts``."""
        self.flex_kernel_options = dict(opts) if opts else None

    def configure_kernels(self, cfg) -> None:
        """The compile section's kernel choices, before anything is compiled: flex attention's
        kernel blocks and stages (``compile.flex_block``/``flex_stages``) and inductor's compile
        threads (``compile.threads``; 1: no worker pool, every kernel compiled in this process)."""
        c = cfg.compile
        self.set_flex_kernel_options(flex_kernel_options(c.flex_block, c.flex_stages))
        if c.threads:
            import os

            from torch._inductor import config as icfg

            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(c.threads)
            icfg.compile_threads = int(c.threads)

    def flex_attention(self, q, k, v, block_mask, *, enable_gqa: bool = False,
                       scale: float | None = None):
        """Compiled flex_attention (never the dense eager path), called through the guard."""
        fn = self.compiled_flex_attention()
        opts = self.flex_kernel_options
        kw = {"kernel_options": dict(opts)} if opts else {}
        with self.guard("flex_attention"):
            return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa, scale=scale, **kw)

    def forget(self) -> None:
        """Forget every function compiled so far and its probes (a bench candidate compiles its own)."""
        with self._lock:
            self._compiled.clear()
            self._probes.clear()

    def names(self) -> list[str]:
        """Names of the functions compiled so far through this registry."""
        with self._lock:
            return sorted(self._compiled)

    def probe_call(self, device: str = "cpu") -> Callable[[], object] | None:
        """A zero-argument callable entering compiled flex_attention (fault injection's fx_race).

        None when flex_attention has not been compiled here. Built once per device; the
        probe's tiny shape may itself need a compile (it is called only by fault injection).
        """
        with self._lock:
            fn = self._compiled.get("flex_attention")
            probe = self._probes.get(str(device))
        if fn is None:
            return None
        if probe is not None:
            return probe
        import torch
        from torch.nn.attention.flex_attention import create_block_mask

        q = torch.zeros(1, 1, 128, 16, device=device)
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 128, 128, device=device)

        def _call():
            with torch.no_grad(), self.guard("flex_attention"):
                return fn(q, q, q, block_mask=bm)
        with self._lock:
            self._probes[str(device)] = _call
        return _call

    def run_probe(self, device: str = "cpu"):
        """Enter compiled code already built here (``probe_call``; fault injection's fx_race);
        a RuntimeError when flex_attention was not compiled."""
        call = self.probe_call(device)
        if call is None:
            raise RuntimeError("no compiled flex_attention in this process")
        return call()
