"""The run config's devices against the host's deployed env: a device the host does not have
is refused when the launch is planned (``--dry-run`` and the real launch alike), not by the
trainer after the run started. Pure."""

from __future__ import annotations

import re
from typing import Any, Mapping

from dfo_contract.env_fingerprint import EnvFingerprint

from ..common.errors import ConfigError

DEVICE_KEYS = ("parallel.drafter_devices", "parallel.target_devices")
_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def check_devices(flat: Mapping[str, Any], fingerprint: EnvFingerprint | None, *,
                  host: str, source: str) -> None:
    """ConfigError naming the first ``cuda[:N]`` device of ``flat`` that the host's env
    (its ``fingerprint.json``: ``cuda_available``, ``device_count``) cannot give. Nothing
    is refused when the fingerprint is unknown."""
    if fingerprint is None:
        return
    has_cuda = bool(fingerprint.cuda_available)
    count = fingerprint.device_count
    for key in DEVICE_KEYS:
        devs = flat.get(key)
        for d in devs if isinstance(devs, (list, tuple)) else ():
            m = _CUDA.match(str(d))
            if not m:
                continue
            if not has_cuda:
                raise ConfigError(
                    f"{key} of {source}: {d} needs a GPU, and the deployed env on {host} sees "
                    "no CUDA device",
                    hint=f"use cpu or auto (--set {key}=[cpu]), or launch on a GPU host")
            idx = int(m.group(1) or 0)
            if count is not None and idx >= count:
                raise ConfigError(
                    f"{key} of {source}: {d}, and the deployed env on {host} sees {count} "
                    f"GPU(s) (cuda:0..cuda:{count - 1})",
                    hint=f"name devices below cuda:{count}, or auto")
