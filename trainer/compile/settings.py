"""The compile cache settings, applied in every thread that compiles (trainer.compile.registry).

``CacheSettings.values()``, applied by ``CacheSettings.apply()`` in every thread that compiles,
once per thread, gate on or off alike -- they are part of the FX-graph and AOT-autograd
cache keys, so every process and thread of every attempt must use the same: the drafter
step's joint graph holds ``torch.autocast(enabled=False)`` regions (RoPE, the chunked CE)
and a custom ``autograd.Function`` (the CE), and AOT-autograd's cache BYPASSES any graph
with either by default (``autograd_cache_bypass``: "Unsupported call_function target
_enter_autocast", then "... autograd_function_apply"), re-tracing and re-partitioning the
joint graph on every start even when every inductor graph hits. Both are pure here
(autocast's arguments are constants in the graph; the Function's forward and backward are
traced into it), so they are marked cacheable.

``CacheSettings.configure(precompile)`` applies the compile section's process-wide switch
(``compile.precompile``: dynamo's precompile cache, trainer.compile.precompile). The process's
``CacheSettings`` is its compile registry's ``cache``.
"""

from __future__ import annotations

import threading

#: torch functions in the drafter step's graph that AOT-autograd's cache refuses by default
#: (the higher-order forms are what some torch versions trace the same regions into)
CACHEABLE_FUNCTIONS = ("torch.amp.autocast_mode._enter_autocast",
                       "torch.amp.autocast_mode._exit_autocast",
                       "torch.ops.higher_order.wrap_with_autocast",
                       "torch.ops.higher_order.wrap_with_set_grad_enabled")


class CacheSettings:
    """The compile cache settings of one process (its trainer.compile.registry.CompileRegistry
    holds them): ``compile.precompile`` and which threads have applied them."""

    def __init__(self):
        #: ``compile.precompile`` (``configure``), read by every compiling thread
        self.precompile = False
        self._applied = threading.local()

    def values(self) -> dict[str, object]:
        """What ``apply`` sets (for reports): config name -> value."""
        import torch

        return {**({"torch._dynamo.config.caching_precompile": True} if self.precompile else {}),
                "torch._functorch.config.autograd_cache_allow_custom_autograd_functions": True,
                "torch._inductor.config.unsafe_marked_cacheable_functions":
                    {f: torch.__version__ for f in CACHEABLE_FUNCTIONS}}

    def apply(self, force: bool = False) -> None:
        """Make the drafter step's joint graph cacheable by AOT-autograd, in the CALLING thread.

        Once per thread (config writes are per-thread on torch >= 2.12); a no-op where torch
        lacks the settings. Called by the registry's ``compiled``/``guard`` (so every
        compiling thread has it) and by the gate's ``thread_setup`` in both gate modes.
        """
        if getattr(self._applied, "done", False) and not force:
            return
        import torch
        import torch._functorch.config as fcfg
        import torch._inductor.config as icfg

        if hasattr(fcfg, "autograd_cache_allow_custom_autograd_functions"):
            fcfg.autograd_cache_allow_custom_autograd_functions = True
        if self.precompile:
            import torch._dynamo.config as dcfg

            if hasattr(dcfg, "caching_precompile"):
                dcfg.caching_precompile = True
        if hasattr(icfg, "unsafe_marked_cacheable_functions"):
            marked = dict(icfg.unsafe_marked_cacheable_functions or {})
            want = {f: torch.__version__ for f in CACHEABLE_FUNCTIONS}
            if any(marked.get(k) != v for k, v in want.items()):
                marked.update(want)
                icfg.unsafe_marked_cacheable_functions = marked
        self._applied.done = True

    def configure(self, precompile: bool) -> None:
        """Apply the compile section's process-wide switches (``compile.precompile``) before
        anything is compiled; the calling thread gets them at once, other threads on their
        first compile (``apply``)."""
        self.precompile = bool(precompile)
        self.apply(force=True)
