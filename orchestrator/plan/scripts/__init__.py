"""Script texts shipped as package data: the one place ``orchestrator.plan`` reads a file.

``plan`` does no I/O; the exception is reading the constant text of a script that ships
inside this package (``*.sh`` here, and the ``orchestrator/remote`` modules whose source
travels as ``python -c`` text). Both go through this module, once per script (cached).
Values never enter a script's text: they reach it as positional parameters (``"$1"``...).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def script_text(name: str) -> str:
    """The text of ``orchestrator/plan/scripts/NAME`` (a shell script)."""
    return resources.files(__name__).joinpath(name).read_text("utf-8")


@lru_cache(maxsize=None)
def remote_source(module: str) -> str:
    """The source of ``orchestrator.remote.MODULE``, to run as ``python -c SOURCE`` where the
    target's Python may not have (this version of) dfo installed."""
    return resources.files("orchestrator.remote").joinpath(f"{module}.py").read_text("utf-8")
