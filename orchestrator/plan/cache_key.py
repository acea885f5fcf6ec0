"""The compile-cache key (pure).

A snapshot of the inductor/triton caches is only worth restoring into the exact
environment and the exact compiled shapes it was built for. The key is a hash of
named *components*, each a short string, so that a mismatch can be explained one
component at a time (``torch.version.cuda: snapshot 12.8, env 13.0``):

* every field of the env fingerprint (``<env>/fingerprint.json``, written by deploy;
  ``dfo_contract.env_fingerprint.EnvFingerprint``) except :data:`FINGERPRINT_EXCLUDED`
  (``dfo``: the orchestrator's version does not change compiled code);
* ``gpu``: the names and capabilities of the devices the drafter compiles for;
* ``trainer.source``: a hash of the deployed ``trainer`` and ``dfo_contract`` source files
  (computed in the env by ``orchestrator.remote.source_hash``, see :func:`source_hash_probe`,
  combined here with :func:`source_hash`);
* ``target.config``: a hash of the target model's ``config.json`` (its shapes);
* ``config.<section>.<field>``: the trainer config fields that change what is compiled
  (model shapes and attention backend, shape buckets, micro batch, devices, compile), of
  the config the trainer runs: with ``model.init_from``, the drafter directory's settings.

Nothing here touches the network or imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from dfo_contract.env_fingerprint import EnvFingerprint, GpuDevice
from dfo_contract.fsio import sha256_bytes
from dfo_contract.markers import last_json_line
from dfo_contract.trainer_config import TrainerConfig

from .probes import Probe, text
from .values import render
from .scripts import remote_source

KEY_FORMAT = 1

# fingerprint field -> component name shown to people (torch's own spelling where there is one)
FINGERPRINT_NAMES: dict[str, str] = {
    "profile": "profile",
    "lock_hash": "lock_hash",
    "python": "python",
    "torch": "torch.__version__",
    "torch_git": "torch.version.git_version",
    "torch_cuda": "torch.version.cuda",
    "triton": "triton",
    "cuda_available": "torch.cuda.is_available()",
    "device_count": "torch.cuda.device_count()",
    "devices": "devices",
    "transformers": "transformers",
    "trainer_import": "trainer_import",
}

#: fingerprint fields that do not go into the key (``errors`` is the probe's import-error
#: text, not an env property)
FINGERPRINT_EXCLUDED = frozenset({"dfo", "errors", "gpu_smoke"})  # gpu_smoke: a health check

#: trainer config sections/fields that change what torch.compile produces. A section name
#: alone means every field of it, except path-like fields (``*path``, ``*dir``,
#: ``model.init_from``) whose value is where things live, not what is compiled: the config
#: given here is the one in force, with the settings an init_from drafter gives
#: (``plan.init_from``), so that drafter's block size, layers and attention are in the key.
COMPILE_SECTIONS: tuple[str, ...] = ("model", "compile")
COMPILE_FIELDS: tuple[str, ...] = (
    "data.max_seq_len",
    "data.num_anchors",
    "data.seq_buckets",
    "data.anchor_buckets",
    "data.pack",
    "data.pack_tokens",
    "data.pack_anchors",
    "train.micro_batch",
    "parallel.layout",
    "parallel.drafter_devices",
)
#: fields of COMPILE_SECTIONS that never change compiled code. ``compile.gate`` is one: the
#: gate's dynamo settings are not part of torch's cache keys and the trainer applies the same
#: cache settings gate on or off (trainer.compile.settings.CacheSettings.apply), so a snapshot
#: warmed with the gate serves a gate-off launch and its compile_gate retry alike.
_NOT_COMPILED = re.compile(r"(path|dir|spec|seed)$|^(gate|gate_timeout|log.*|init_from)$")


def render_devices(devices: Sequence[GpuDevice]) -> str:
    if not devices:
        return "none"
    return ", ".join(f"{d.index}:{d.name}" + (f" ({d.capability})" if d.capability else "")
                     for d in devices)


def fingerprint_components(fingerprint: EnvFingerprint) -> dict[str, str]:
    """Components from the env fingerprint: every field of its JSON object (keys the record
    does not know included, as ``fingerprint.<key>``) but :data:`FINGERPRINT_EXCLUDED`."""
    out: dict[str, str] = {}
    for field, value in fingerprint.to_json().items():
        if field in FINGERPRINT_EXCLUDED:
            continue
        name = FINGERPRINT_NAMES.get(field, f"fingerprint.{field}")
        out[name] = render_devices(fingerprint.devices) if field == "devices" else render(value)
    return out


#: a trainer config: typed, or nested as ``TrainerConfig.to_dict`` writes it (a config
#: another trainer version wrote)
AnyConfig = Union[TrainerConfig, Mapping[str, Any]]


def _get(tree: AnyConfig, dotted: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in dotted.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return False, None
            node = node[part]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        else:
            return False, None
    return True, node


def _section(config: AnyConfig, section: str) -> Any:
    """One section's fields by name (the model's as the YAML writes them: a method's own
    fields flat, ``ModelConfig.flat``)."""
    if isinstance(config, Mapping):
        return config.get(section)
    node = getattr(config, section, None)
    if node is None:
        return None
    return node.flat() if section == "model" else dataclasses.asdict(node)


def compile_config(config: AnyConfig) -> dict[str, str]:
    """The compile-relevant part of a trainer config (a ``TrainerConfig``, or a nested dict
    as its ``to_dict`` writes it), as ``config.<dotted>`` components. Fields the config does
    not have are left out (an older/newer trainer), so only fields both sides know can
    differ."""
    out: dict[str, str] = {}
    for section in COMPILE_SECTIONS:
        node = _section(config, section)
        if isinstance(node, Mapping):
            for field in sorted(node):
                if _NOT_COMPILED.search(field):
                    continue
                out[f"config.{section}.{field}"] = render(node[field])
    for dotted in COMPILE_FIELDS:
        found, value = _get(config, dotted)
        if found:
            out[f"config.{dotted}"] = render(value)
    return out


def drafter_gpus(fingerprint: EnvFingerprint, drafter_devices: Iterable[str] | None) -> str:
    """Names (and capability) of the devices the drafter compiles for, e.g.
    ``cuda:0=NVIDIA H200 (9.0)``; ``cpu`` for CPU devices. A device index the
    fingerprint does not list is named ``unknown`` (its cache would be a guess)."""
    devices = {d.index: d for d in fingerprint.devices}
    parts = []
    names = [str(d) for d in drafter_devices or ["auto"]]
    if "auto" in names:  # the trainer picks: every GPU the env sees, else the CPU
        names = [f"cuda:{i}" for i in sorted(devices)] if fingerprint.cuda_available and devices \
            else ["cpu"]
    for dev in names:
        if dev.startswith("cuda"):
            idx = int(dev.split(":", 1)[1]) if ":" in dev else 0
            d = devices.get(idx)
            if d is None:
                parts.append(f"{dev}=unknown")
            else:
                parts.append(f"{dev}={d.name}" + (f" ({d.capability})" if d.capability else ""))
        else:
            parts.append(dev)
    return ", ".join(parts)


def source_hash(file_hashes: Mapping[str, str]) -> str:
    """Combine ``{relative path: sha256}`` of the trainer's source files into one hash."""
    return sha256_bytes(b"".join(rel.encode("utf-8") + b"\0" + file_hashes[rel].encode("ascii") + b"\n"
                                 for rel in sorted(file_hashes)))


#: The packages whose source is ``trainer.source``: the trainer, and the contract it imports.
SOURCE_PACKAGES = ("trainer", "dfo_contract")
SOURCE_HASH_MODULE = "orchestrator.remote.source_hash"
#: ``orchestrator/remote/source_hash.py``'s source (``python -c SOURCE_HASH_SCRIPT PKG...``
#: gives the same reply as ``python -m orchestrator.remote.source_hash PKG...``).
SOURCE_HASH_SCRIPT = remote_source("source_hash")


def source_hash_probe(python: str, packages: Iterable[str] = SOURCE_PACKAGES,
                      *, timeout: float = 600.0) -> Probe[str | None]:
    """Hash the deployed env's trainer (and contract) source: ``python -m`` in the env,
    whose dfo wheel holds the module. The result is :func:`source_hash` of the reply, or
    None when the env lacks a package or printed no reply."""
    return Probe("source-hash", (python, "-m", SOURCE_HASH_MODULE, *packages),
                 lambda out: parse_source_hashes(text(out.stdout)), timeout=timeout)


def parse_source_hashes(output: str) -> str | None:
    """The reply (``{path: sha256}``, see the module) combined by :func:`source_hash`."""
    reply = last_json_line(output)
    if not isinstance(reply, dict) or not reply or "error" in reply:
        return None
    return source_hash(reply)


@dataclass(frozen=True)
class CacheKey:
    key: str
    components: dict[str, str]


def _safe(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-.")
    return s[:24] or "env"


def key_of(components: Mapping[str, str], *, profile: str | None = None) -> str:
    """The key string: ``<profile>-<16 hex>`` (filesystem-safe, stable)."""
    blob = json.dumps({"format": KEY_FORMAT, "components": dict(components)},
                      sort_keys=True, separators=(",", ":"))
    digest = sha256_bytes(blob.encode("utf-8"))[:16]
    return f"{_safe(profile or 'env')}-{digest}"


def compute_key(
    fingerprint: EnvFingerprint,
    config: AnyConfig,
    *,
    trainer_source: str,
    target_config: str | None = None,
) -> CacheKey:
    """The cache key of (env, compiled shapes): ``config`` is the trainer's config in force
    (typed, or nested). ``trainer_source`` is :func:`source_hash`
    of the deployed trainer; ``target_config`` the sha256 of the target's config.json
    (None when there is none)."""
    comps = fingerprint_components(fingerprint)
    comps.update(compile_config(config))
    _, drafter = _get(config, "parallel.drafter_devices")
    comps["gpu"] = drafter_gpus(fingerprint, drafter if isinstance(drafter, (list, tuple)) else None)
    comps["trainer.source"] = trainer_source
    comps["target.config"] = target_config or "none"
    comps = dict(sorted(comps.items()))
    return CacheKey(key=key_of(comps, profile=fingerprint.profile or "env"),
                    components=comps)


def target_config_path(cfg: TrainerConfig) -> str | None:
    """The target's config.json on the host (its sha256 is the key's ``target.config``)."""
    target = cfg.model.target_path
    return posixpath.join(target, "config.json") if target else None


def config_key(fingerprint: EnvFingerprint, cfg: TrainerConfig, *, trainer_source: str,
               file_hash: Callable[[str], str | None]) -> CacheKey:
    """The cache key of ``cfg``, the trainer's config in force (``model.init_from``'s
    settings applied: ``plan.init_from.effective``), as ``dfo launch`` and ``dfo warm-cache``
    both compute it; ``file_hash(path)``: the sha256 of a file on the host (None: missing)."""
    target = target_config_path(cfg)
    return compute_key(fingerprint, cfg, trainer_source=trainer_source,
                       target_config=file_hash(target) if target else None)


def diff_components(snapshot: Mapping[str, str], env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``[(name, snapshot value, env value)]`` for each component that differs
    (``absent`` where one side lacks it), sorted by name."""
    out = []
    for name in sorted(set(snapshot) | set(env)):
        a = snapshot.get(name, "absent")
        b = env.get(name, "absent")
        if a != b:
            out.append((name, _short(a), _short(b)))
    return out


def _short(v: str) -> str:
    v = str(v)
    if re.fullmatch(r"[0-9a-f]{40,64}", v):
        return v[:12]
    return v if len(v) <= 80 else v[:77] + "..."


def explain_diff(diffs: Iterable[tuple[str, str, str]]) -> str:
    """One line: ``torch.version.cuda: snapshot 12.8, env 13.0; gpu: snapshot ..., env ...``."""
    return "; ".join(f"{n}: snapshot {a}, env {b}" for n, a, b in diffs)
