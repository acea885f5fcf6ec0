"""What a user gives ``dfo launch``, checked before anything touches a host (pure):
``--resume`` text, ``--run-name``, ``--set``; and which checkpoint a ``--resume`` names in a
listing of the host's checkpoints (``dfo_contract.checkpoints.CkptInfo``, read from the
manifests by the launch facts probe).

Nothing a user types reaches a shell: ``--resume`` is a checkpoint name, ``latest`` or a
path under the host's root made of plain characters.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dfo_contract.checkpoints import STEP_RE, CkptInfo

from ..errors import ConfigError, NotFoundError

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/@+=-]*")
SET_KEY = re.compile(r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*")
#: longest ``--resume`` a user may give (a path under the root)
RESUME_MAX = 4096

#: keys launch owns; --set may not change them
RESERVED_KEYS = frozenset({"run.dir", "checkpoint.dir", "fault.spec"})


# --- --resume --------------------------------------------------------------------------

@dataclass(frozen=True)
class ResumeArg:
    kind: str          # "latest" | "name" | "path"
    value: str         # "latest", "step_690", or an absolute normalized path


def parse_resume(value: str | None, root: str) -> ResumeArg | None:
    """Validate ``--resume``. Raises ConfigError for anything but a checkpoint name
    (``step_N``), ``latest``, or an absolute path under ``root`` with plain characters."""
    if value is None:
        return None
    v = value.strip()
    how = f"use a checkpoint name like step_690, 'latest', or a path under {root}"
    if v == "latest":
        return ResumeArg("latest", v)
    if len(v) > RESUME_MAX:
        raise ConfigError(f"--resume: {value[:40]!r}... is too long", hint=how)
    if STEP_RE.fullmatch(v):
        return ResumeArg("name", v)
    if v.startswith("/"):
        if not SAFE_PATH.fullmatch(v) or any(p == ".." for p in v.split("/")):
            raise ConfigError(f"--resume: {value!r} is not a plain path", hint=how)
        norm = posixpath.normpath(v)
        rootn = posixpath.normpath(root)
        if not (norm + "/").startswith(rootn.rstrip("/") + "/") or norm == rootn:
            raise ConfigError(f"--resume: {value!r} is outside the host's root {root}", hint=how)
        return ResumeArg("path", norm)
    raise ConfigError(f"--resume: {value!r} is not a checkpoint name", hint=how)


def parse_checkpoint_listing(obj: Any) -> list[CkptInfo]:
    """``python -m dfo_contract.checkpoints list DIR --json`` output (JSON-decoded: the
    ``{"checkpoints": [...]}`` object or the list), oldest first."""
    if isinstance(obj, Mapping):
        obj = obj.get("checkpoints", [])
    out = [CkptInfo.from_json(e) for e in obj or [] if isinstance(e, Mapping)]
    return sorted(out, key=lambda c: c.step)


def skipped_by_latest(listing: Sequence[CkptInfo]) -> list[CkptInfo]:
    """The torn/incomplete checkpoints newer than the newest valid one: what ``--resume
    latest`` passes over (each is named in a warning)."""
    valid = [c.step for c in listing if c.valid]
    floor = max(valid) if valid else -1
    return [c for c in listing if not c.valid and c.step > floor]


def skipped_warning(c: CkptInfo) -> str:
    return (f"--resume latest: skipping checkpoint {c.name} "
            f"({c.reason or 'incomplete or torn: its manifest does not verify'})")


def _valid_names(listing: Sequence[CkptInfo]) -> str:
    return ", ".join(c.name for c in listing if c.valid) or "none"


def resolve_resume(resume: ResumeArg, listing: Sequence[CkptInfo], ckpt_dir: str) -> str:
    """The checkpoint path a ``--resume`` names in ``listing`` (the checkpoints of
    ``ckpt_dir``; for a path, of its parent); NotFoundError lists the valid ones."""
    valid = [c for c in listing if c.valid]
    have = _valid_names(listing)
    if resume.kind == "latest":
        if not valid:
            raise NotFoundError(f"--resume latest: no valid checkpoint in {ckpt_dir}",
                                hint="launch without --resume to start from scratch")
        return valid[-1].path or posixpath.join(ckpt_dir, valid[-1].name)
    name = posixpath.basename(resume.value.rstrip("/"))
    for c in listing:
        if c.name == name or (resume.kind == "path" and c.path.rstrip("/") == resume.value):
            if c.valid:
                return resume.value if resume.kind == "path" else \
                    (c.path or posixpath.join(ckpt_dir, c.name))
            raise NotFoundError(f"--resume {resume.value}: checkpoint is incomplete or corrupt"
                                f" ({c.reason or 'manifest does not verify'})",
                                hint=f"valid checkpoints in {ckpt_dir}: {have}")
    if resume.kind == "path":
        raise NotFoundError(f"--resume {resume.value}: not a checkpoint",
                            hint=f"valid in that dir: {have}")
    raise NotFoundError(f"--resume {resume.value}: no such checkpoint in {ckpt_dir}",
                        hint=f"valid checkpoints: {have}")


# --- run names and --set --------------------------------------------------------------

def check_run_name(name: str, *, derived_from: str | None = None) -> str:
    """``name``, when it is a valid run name. ``derived_from``: the name was not given but
    taken from that (the config file's stem), so the error says where it came from."""
    if not RUN_NAME.fullmatch(name or ""):
        if derived_from is not None:
            raise ConfigError(f"the run name {name!r}, taken from {derived_from}, is not a valid "
                              "run name",
                              hint="give one with --run-name NAME (letters, digits, '.', '_' "
                                   "or '-', at most 48 characters), or rename the file")
        raise ConfigError(f"--run-name: {name!r} is not a valid run name",
                          hint="use letters, digits, '.', '_' or '-', at most 48 characters")
    return name


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``--set train.micro_batch=4`` -> {"train.micro_batch": 4} (values read as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE",
                              hint="e.g. --set train.micro_batch=4")
        k, v = item.split("=", 1)
        k = k.strip()
        if not SET_KEY.fullmatch(k):
            raise ConfigError(f"--set {item!r}: key must be SECTION.FIELD",
                              hint="e.g. --set compile.gate=false")
        if k in RESERVED_KEYS:
            raise ConfigError(f"--set {k}: set by dfo launch itself",
                              hint="use --run-name / --fault instead")
        try:
            out[k] = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            out[k] = v
    return out


def flatten(d: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (sections of fields) -> flat dotted keys."""
    out: dict[str, Any] = {}
    for sec, body in d.items():
        if isinstance(body, Mapping):
            for k, v in body.items():
                out[f"{sec}.{k}"] = v
    return out
