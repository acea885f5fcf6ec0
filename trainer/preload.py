"""Imports only: what ``python -m trainer train`` will need, imported ahead of time.

The supervisor's standby interpreter (orchestrator.supervisor.shim ``--standby``) calls
:func:`preload` while the current attempt trains, so that the next attempt starts with
torch, the loop, the layouts, the compile stack and the target's transformers modeling
module already in ``sys.modules``. Nothing here runs the trainer, touches a device or reads
the environment into trainer state (``trainer.train.loop.train`` reads
the environment when it starts, so the attempt's own environment is what counts). Never imports ``orchestrator``.
"""

from __future__ import annotations

import importlib
import json
import os
import re

_MODEL_TYPE = re.compile(r"^[a-z0-9_]+$")


def target_modeling_module(target_path: str | None) -> str | None:
    """``transformers.models.<t>.modeling_<t>`` for the target's config.json ``model_type``
    (the module ``AutoModelForCausalLM.from_pretrained`` imports), or None."""
    if not target_path:
        return None
    try:
        with open(os.path.join(target_path, "config.json")) as f:
            mt = str(json.load(f).get("model_type") or "")
    except (OSError, ValueError, AttributeError):
        return None
    mt = mt.replace("-", "_")
    if not _MODEL_TYPE.match(mt):
        return None
    return f"transformers.models.{mt}.modeling_{mt}"


def modules_for(*, target_path: str | None, compile: bool, layout: str) -> list[str]:
    """The modules to import, in order (torch first)."""
    mods = ["torch", "trainer.train.loop", "trainer.data.datasets", "trainer.data.stream",
            "trainer.model.target", "trainer.core.step", "trainer.compile.gate",
            "trainer.parallel.single"]
    if layout == "threads":
        mods.append("trainer.parallel.threads")
    if compile:
        mods += ["torch._dynamo", "torch._inductor.compile_fx",
                 "torch.nn.attention.flex_attention"]
    mods += ["transformers", "transformers.modeling_utils"]
    m = target_modeling_module(target_path)
    if m:
        mods.append(m)
    return mods


def preload(*, target_path: str | None, compile: bool = True,
            layout: str = "single") -> tuple[list[str], list[str]]:
    """Import every module of :func:`modules_for`; return (imported, failed as 'name: why').
    A failed import is not an error here: the attempt imports (and reports) it itself."""
    done, failed = [], []
    for name in modules_for(target_path=target_path, compile=compile, layout=layout):
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as e:  # noqa: BLE001 - best effort; the attempt will say
            failed.append(f"{name}: {e.__class__.__name__}: {e}")
    return done, failed
