"""The env probe (an argv plus a pure parser) and the comparison with a profile (pure).

The probe (``orchestrator/remote/env_probe.py``, :func:`env_probe`) runs *inside* an env's
interpreter: ``<env>/bin/python -c PROBE_SCRIPT``. It prints one line ``@dfo-probe {json}``.
``parse_probe`` reads the output into a :class:`~dfo_contract.env_fingerprint.EnvFingerprint`
(docs/contracts.md); ``compare`` checks it against a profile's
``expect:`` mapping and returns mismatches named by the field a person knows, e.g.
``torch.version.cuda: expected 12.8, got 13.0``.

Expectation values:
- a scalar (str/int/bool/null): must be equal (``python: "3.11"`` matches ``3.11.2``:
  dotted versions match by leading components);
- a string holding ``*``/``?``: a glob (``transformers: "5.*"``);
- ``{min: N}`` / ``{max: N}`` for numbers (``device_count: {min: 1}``);
- ``{in: [a, b]}``: one of.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dfo_contract.env_fingerprint import FINGERPRINT_FIELDS, EnvFingerprint
from dfo_contract.errors import ContractError

from ..common.errors import DeployError
from ..config.profiles import EXPECT_FIELDS
from .probes import Probe, text
from .scripts import remote_source
from .values import render

PROBE_MARK = "@dfo-probe "

#: ``orchestrator/remote/env_probe.py``'s source, run as ``<env>/bin/python -c PROBE_SCRIPT``
#: (the env's dfo wheel is not trusted while it is being verified).
PROBE_SCRIPT = remote_source("env_probe")
#: the probe imports torch (and may touch CUDA): give it time
PROBE_TIMEOUT = 600.0
PROBE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "CUDA_MODULE_LOADING": "LAZY"}


def probe_argv(python: str) -> list[str]:
    """The argv that probes the env whose interpreter is ``python``."""
    return [python, "-c", PROBE_SCRIPT]


def env_probe(python: str, *, timeout: float = PROBE_TIMEOUT) -> Probe[EnvFingerprint]:
    """The env probe as a :class:`~.probes.Probe`: parse raises DeployError without a result."""
    return Probe("env", tuple(probe_argv(python)),
                 lambda out: parse_probe(text(out.stdout) + "\n" + text(out.stderr)),
                 timeout=timeout, env=PROBE_ENV)


def parse_probe(output: str) -> EnvFingerprint:
    """The probe's reply (the last ``@dfo-probe`` line), without ``profile`` and
    ``lock_hash``. DeployError when absent or when it does not read."""
    hint = "the env's python does not start; redeploy with `dfo deploy --force`"
    for line in reversed(output.splitlines()):
        if line.startswith(PROBE_MARK):
            try:
                data = json.loads(line[len(PROBE_MARK):])
            except json.JSONDecodeError:
                break
            if isinstance(data, dict):
                try:
                    return EnvFingerprint.from_json(data, what="the env probe's result")
                except ContractError as e:
                    raise DeployError(str(e), hint=hint) from None
    tail = next((ln for ln in reversed(output.strip().splitlines()) if ln.strip()), "")
    raise DeployError("the env probe printed no result" + (f": {tail.strip()}" if tail else ""),
                      hint=hint)


def build_fingerprint(probe: EnvFingerprint, *, profile: str, lock_hash: str) -> EnvFingerprint:
    """fingerprint.json's record: the probe's reply with the profile and the lock's hash."""
    return probe.of_env(profile=profile, lock_hash=lock_hash)


def fingerprint_json(fp: EnvFingerprint) -> bytes:
    """fingerprint.json's bytes: the contract's fields, in order, one per line (``errors``
    only when a module failed to import)."""
    return (json.dumps(fp.to_json(), indent=1, sort_keys=False) + "\n").encode()


def parse_fingerprint(data: bytes | str) -> EnvFingerprint:
    """fingerprint.json's record from its bytes: ValueError (one line) when it is not JSON,
    not an object or not a fingerprint."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    try:
        return EnvFingerprint.from_json(obj)
    except ContractError as e:
        raise ValueError(str(e)) from None


@dataclass(frozen=True)
class Mismatch:
    field: str     # the fingerprint key
    expected: Any
    got: Any
    note: str = ""

    @property
    def label(self) -> str:
        return EXPECT_FIELDS.get(self.field, self.field)

    def __str__(self) -> str:
        s = f"{self.label}: expected {render(self.expected, spaced=True)}, got {render(self.got, spaced=True)}"
        return f"{s} ({self.note})" if self.note else s


def _version_prefix_match(expected: str, got: str) -> bool:
    e, g = expected.split("."), got.split(".")
    return len(e) <= len(g) and g[: len(e)] == e


def matches(expected: Any, got: Any) -> bool:
    """One expectation against one observed value (see the module doc)."""
    if isinstance(expected, dict):
        ok = True
        if "min" in expected:
            ok &= isinstance(got, (int, float)) and not isinstance(got, bool) and got >= expected["min"]
        if "max" in expected:
            ok &= isinstance(got, (int, float)) and not isinstance(got, bool) and got <= expected["max"]
        if "in" in expected:
            ok &= any(matches(x, got) for x in expected["in"])
        return bool(ok)
    if expected is None or isinstance(expected, bool):
        return got is expected
    if isinstance(expected, (int, float)):
        return not isinstance(got, bool) and got == expected
    exp = str(expected)
    if got is None:
        return False
    gs = str(got)
    if any(c in exp for c in "*?["):
        return fnmatch.fnmatchcase(gs, exp)
    if exp == gs:
        return True
    # dotted versions: "3.11" matches "3.11.2", "12.8" does not match "12.80"
    if all(p.isdigit() for p in exp.split(".")) and "." in exp:
        return _version_prefix_match(exp, gs)
    return False


def _observed(fp: EnvFingerprint, field: str) -> Any:
    if field == "device_names":
        return [d.name for d in fp.devices]
    if field == "device_capability":
        return [d.capability for d in fp.devices]
    return fp.value(field)


def compare(fp: EnvFingerprint, expect: Mapping[str, Any]) -> list[Mismatch]:
    """Field-named mismatches between a fingerprint (or probe) and a profile's ``expect``."""
    out: list[Mismatch] = []
    for field, exp in expect.items():
        got = _observed(fp, field)
        if field in ("device_names", "device_capability"):
            # every device must match (a list expectation: each device in order)
            if isinstance(exp, (list, tuple)):
                ok = len(exp) == len(got) and all(matches(e, g) for e, g in zip(exp, got, strict=True))
            else:
                ok = bool(got) and all(matches(exp, g) for g in got)
            if not ok:
                out.append(Mismatch(field, exp, got))
            continue
        if not matches(exp, got):
            note = ""
            if field == "trainer_import" and fp.error("trainer"):
                note = fp.error("trainer")
            elif field in ("torch", "torch_git", "torch_cuda", "cuda_available", "device_count") \
                    and fp.error("torch"):
                note = fp.error("torch")
            elif field == "transformers" and fp.error("transformers"):
                note = fp.error("transformers")
            out.append(Mismatch(field, exp, got, note))
    return out


def fingerprint_changes(recorded: EnvFingerprint, now: EnvFingerprint,
                        fields: Sequence[str] = FINGERPRINT_FIELDS[2:]) -> list[Mismatch]:
    """Fields whose probed value differs from the recorded fingerprint (drift)."""
    return [Mismatch(f, recorded.value(f), now.value(f)) for f in fields
            if recorded.value(f) != now.value(f)]
