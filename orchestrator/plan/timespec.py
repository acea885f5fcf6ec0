"""Times given on the command line (pure)."""

from __future__ import annotations

from ..common.errors import ConfigError


def parse_since(text: str | None, now: float) -> float | None:
    """``--since``: ``30s``, ``10m``, ``2h``, ``1d`` ago, or a unix time."""
    if text is None:
        return None
    t = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if t and t[-1] in units:
            return now - float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise ConfigError(f"--since {text!r}: expected e.g. 30s, 10m, 2h, 1d or a unix time") \
            from None
