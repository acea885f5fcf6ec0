"""The frozen target's decoder layers compiled from outside the model (regional compile).

``compile_layers(registry, target, mode, dynamic=...)`` wraps each kept decoder layer's
``forward`` (``Target.layers``): one function, the layer class's ``forward``, compiled once
through the process's ``registry`` (a trainer.compile.registry.CompileRegistry; so every
call runs inside the compile gate's guard: its lock once sealed, the cache settings in the
calling thread) and called with each layer as its first argument, so one graph serves every layer of a device and shape. The tap hooks
run outside it, in ``Module.__call__``. Inside ``with target.eager():`` the layers run their
eager forward (evaluation, whose shapes the gate did not warm).
"""

from __future__ import annotations

from .registry import CompileRegistry, variant


def compile_layers(registry: CompileRegistry, target, mode: str = "default", *,
                   dynamic: bool = False) -> str:
    """Compile ``target``'s kept decoder layers' forward. ``dynamic``: compiled with dynamic
    shapes, so one graph serves every sequence length too. Idempotent; returns the registry
    name (``target_layer[...]``), also kept as ``target.compiled_layers``. No CUDA-graph
    modes: every layer replays the same graph, which would overwrite the tapped outputs the
    hooks hold."""
    if mode in ("reduce-overhead", "max-autotune"):  # CUDA graphs
        raise ValueError(f"compile_layers: mode {mode!r} uses CUDA graphs, which "
                         "overwrite the tapped layer outputs; use default or "
                         "max-autotune-no-cudagraphs")
    layers = target.layers
    cls = type(layers[0])
    tag, opts = variant(cls.__name__, mode, dynamic)
    name = f"target_layer[{tag.replace('[', ', ').rstrip(']')}]"
    if target.compiled_layers == name:
        return name
    fn = cls.forward
    for layer in layers:
        layer.forward = _compiled_forward(registry, target, layer, name, fn, opts)
    target.compiled_layers = name
    return name


def _compiled_forward(registry, target, layer, name: str, fn, opts: dict):
    eager = fn.__get__(layer, type(layer))

    def forward(*args, **kwargs):
        if target.runs_eager():
            return eager(*args, **kwargs)
        c = registry.compiled(name, fn, **opts)
        with registry.guard(name):
            return c(layer, *args, **kwargs)
    return forward
