"""The env fingerprint, read and written by ``dfo_contract.codec``: the env probe's reply
(``orchestrator/remote/env_probe.py``, run in the env's interpreter; it stays stdlib-only
and writes this shape by hand as ``@dfo-probe {json}``) and ``<env>/fingerprint.json``
(the same fields after the profile and the lock's hash, written by deploy;
docs/contracts.md, "Env fingerprint"). Readers use attributes; a lookup by a field's name
from configuration (a profile's ``expect:``, the fields a group's members must agree on,
drift) goes through :meth:`EnvFingerprint.value`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .codec import decode, encode

#: the fields of fingerprint.json, in order (``errors`` follows, only when not empty)
FINGERPRINT_FIELDS = ("profile", "lock_hash", "dfo", "python", "torch", "torch_git", "torch_cuda",
                      "triton", "cuda_available", "device_count", "devices", "transformers",
                      "trainer_import", "gpu_smoke")


@dataclass(frozen=True, kw_only=True)
class GpuDevice:
    """One CUDA device the env sees: ``{"index", "name", "capability": "9.0"}``."""

    index: int
    name: str
    capability: str


@dataclass(frozen=True, kw_only=True)
class EnvFingerprint:
    """What an env's interpreter has. The probe's reply has every field but ``profile`` and
    ``lock_hash`` (a field absent when its module did not import reads as its default);
    fingerprint.json has them all. ``errors``: module -> the import error (``torch``,
    ``transformers``, ``trainer``, ``gpu_smoke``), written only when not empty; keys
    nobody knows are kept in ``extra``."""

    profile: str = ""
    lock_hash: str = ""
    dfo: str | None = None
    python: str | None = None
    torch: str | None = None
    torch_git: str | None = None
    torch_cuda: str | None = None
    triton: str | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    transformers: str | None = None
    trainer_import: bool | None = None
    gpu_smoke: str | None = None         # "ok", "skipped", the error; None without CUDA
    errors: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any, *, what: str = "the env fingerprint") -> "EnvFingerprint":
        """The record from its JSON object (ContractError, one line, when it does not read)."""
        return decode(cls, obj, what=what)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: fingerprint.json's fields in order, ``errors`` when not empty
        (a probe's reply: without ``profile`` and ``lock_hash``, which it has not)."""
        skip: tuple[str, ...] = () if self.errors else ("errors",)
        if not self.profile and not self.lock_hash:
            skip += ("profile", "lock_hash")
        return encode(self, skip=skip)

    def of_env(self, *, profile: str, lock_hash: str) -> "EnvFingerprint":
        """This probe's reply as the fingerprint of the env built for ``profile`` from the
        lock whose hash is ``lock_hash``."""
        return dataclasses.replace(self, profile=profile, lock_hash=lock_hash)

    def value(self, name: str) -> Any:
        """The JSON value of the field named ``name`` (None when it has none): the one
        lookup by a name that comes from configuration."""
        return self.to_json().get(name)

    def error(self, module: str) -> str:
        """The import error the probe recorded for ``module`` ("" when none)."""
        return self.errors.get(module, "")


@dataclass(frozen=True, kw_only=True)
class EnvComplete:
    """``<env>/.dfo-complete``, written last by deploy (an env without it is half-built):
    the profile, the lock's hash, dfo's version, the wheel installed (its path on the host,
    sha256 and source digest) and when (UTC, ISO). Read tolerant (a mistyped field is its
    default); keys it does not know are kept in ``extra``."""

    TOLERANT = True

    profile: str = ""
    lock_hash: str = ""
    dfo: str = ""
    wheel: str = ""
    wheel_sha256: str = ""
    source_digest: str = ""
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> "EnvComplete":
        return decode(cls, obj, what="the env's .dfo-complete")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out
