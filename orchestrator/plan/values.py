"""How a config or environment value reads as text (pure): one rule for the cache key's
components and for the messages that compare an environment with what was expected."""

from __future__ import annotations

import json
from typing import Any, Mapping


def render(value: Any, *, spaced: bool = False) -> str:
    """One short, stable string: ``none``, ``true``/``false``, ``[a,b]``, a mapping as sorted
    compact JSON. ``spaced``: for a sentence (``[a, b]``, a mapping as ``key value, ...``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + (", " if spaced else ",").join(render(v, spaced=spaced) for v in value) + "]"
    if isinstance(value, Mapping):
        if spaced:
            return ", ".join(f"{k} {v}" for k, v in value.items())
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return str(value)
