"""Checkpoint manifests, torch-free: verify ``step_N`` dirs, find the newest valid one.

A checkpoint directory ``<dir>/step_N/`` is complete when its ``manifest.json``
(written last) parses, says ``"step": N``, and every file it lists exists with the
recorded size and sha256:

    {"format": 1, "step": N, "files": {"drafter.safetensors": {"sha256": "...", "size": 123}, ...}}

Directories being written are named ``.step_N.tmp-<pid>`` and are never listed. The manifest
is :class:`CheckpointManifest` (each file a ``cache_records.FileDigest``), read and written
by ``dfo_contract.codec``; a manifest the codec refuses is of an unknown format.

Lineage: a manifest may carry ``"lineage": {"run": RUN_ID, "attempt": n}`` -- which run
(and attempt) wrote the checkpoint. It is optional (older checkpoints still verify); a
supervisor resumes only from its own run's checkpoints (``newest_of_run``) and the trainer's
prune deletes only its own run's. A complete ``.step_N.tmp-PID`` / ``.step_N.old-PID`` of a
dead writer with no ``step_N`` beside it (a crash mid-swap) is promoted to ``step_N``, never
deleted (``promote_orphans``).

    python -m dfo_contract.checkpoints list DIR [--json] [--no-hash] [--no-promote]

lists the ``step_N`` dirs newest first, valid or why not (``python -m trainer.core.checkpoints
list`` is the same command). The orchestrator runs it remotely with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, replace
from typing import Any, Mapping

from .cache_records import FileDigest
from .codec import decode, encode, opt
from .errors import ContractError, VersionError
from .exitcodes import CheckpointError
from .fsio import atomic_write_bytes, sha256_file
from .procs import pid_alive

log = logging.getLogger("dfo")
FORMAT = 1
MANIFEST = "manifest.json"
REQUIRED_FILES = ("drafter.safetensors", "optim.pt", "sched.pt", "rng.pt", "data.json", "config.yaml")
STEP_RE = re.compile(r"^step_(\d+)$")
TMP_RE = re.compile(r"^\.step_(\d+)\.tmp-(\d+)$")
ORPHAN_RE = re.compile(r"^\.step_(\d+)\.(tmp|old)-(\d+)$")   # being written / swapped out


@dataclass(frozen=True)
class CkptInfo:
    name: str
    step: int
    path: str
    valid: bool
    reason: str = ""        # why not valid ("" when valid)
    run: str | None = None  # the run that wrote it (manifest lineage; None: unknown/older)

    def to_json(self) -> dict:
        out: dict = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CkptInfo":
        """One entry of ``list --json`` (``to_json``), read tolerant: a missing or mistyped
        field reads as empty (``valid`` false, ``run`` None), a missing ``name`` as the last
        part of ``path`` and a missing ``step`` as the name's ``N`` (-1: none)."""
        got = decode(cls, d, what="a checkpoint listing entry", tolerant=True,
                     name="", step=None, path="", valid=False, reason="", run=None)
        name = got.name or os.path.basename(got.path.rstrip("/"))
        step: int | None = got.step
        if step is None:
            m = STEP_RE.fullmatch(name)
            step = int(m.group(1)) if m else -1
        return replace(got, name=name, step=step, run=got.run or None)


@dataclass(frozen=True, kw_only=True)
class Lineage:
    """The manifest's ``lineage``: the run (and attempt) that wrote the checkpoint."""
    run: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointManifest:
    """``manifest.json``: ``{"format", "step", "files": {name: {"sha256", "size"}}}`` and,
    optionally, ``lineage``."""
    format: int
    step: int
    files: dict[str, FileDigest]
    lineage: Lineage | None = opt()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "CheckpointManifest":
        """ContractError when ``obj`` is not a manifest (VersionError: of another format)."""
        man = decode(cls, obj, what=MANIFEST)
        if man.format != FORMAT:
            raise VersionError(f"{MANIFEST} of format {man.format}: this dfo reads format "
                               f"{FORMAT}")
        return man


def build_manifest(dirpath: str, step: int, files: list[str], *,
                   lineage: dict | None = None) -> dict:
    """The manifest of ``files`` in ``dirpath`` (``lineage``: ``{"run", "attempt"}``)."""
    entries = {}
    for name in files:
        p = os.path.join(dirpath, name)
        entries[name] = FileDigest(sha256=sha256_file(p), size=os.path.getsize(p))
    return CheckpointManifest(
        format=FORMAT, step=int(step), files=entries,
        lineage=None if lineage is None else decode(Lineage, lineage,
                                                     what="a checkpoint's lineage"),
    ).to_json()


def write_manifest(dirpath: str, step: int, files: list[str], *,
                   lineage: dict | None = None) -> dict:
    """Write manifest.json (via a temp file + rename + fsync) after every listed file.
    ``lineage={"run": run_id, "attempt": n}`` records who wrote it (optional)."""
    man = build_manifest(dirpath, step, files, lineage=lineage)
    atomic_write_bytes(os.path.join(dirpath, MANIFEST),
                       json.dumps(man, indent=1, sort_keys=True).encode())
    return man


def verify(dirpath: str, *, expect_step: int | None = None, check_hashes: bool = True) -> tuple[bool, str]:
    """(True, "") when ``dirpath`` is a complete, uncorrupted checkpoint; else (False, why)."""
    mp = os.path.join(dirpath, MANIFEST)
    if not os.path.isdir(dirpath):
        return False, "not a directory"
    if not os.path.isfile(mp):
        return False, "no manifest.json (torn: the save did not finish)"
    try:
        with open(mp) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        return False, f"manifest.json unreadable ({e.__class__.__name__})"
    try:
        man = CheckpointManifest.from_json(raw)
    except ContractError:
        return False, "manifest.json has an unknown format"
    if expect_step is not None and man.step != expect_step:
        return False, f"manifest says step {man.step}, directory says step {expect_step}"
    missing = [n for n in REQUIRED_FILES if n not in man.files]
    if missing:
        return False, f"manifest lacks {', '.join(missing)}"
    for name, ent in sorted(man.files.items()):
        p = os.path.join(dirpath, name)
        if not os.path.isfile(p):
            return False, f"{name} missing"
        size = os.path.getsize(p)
        if size != ent.size:
            return False, f"{name} has {size} bytes, manifest says {ent.size} (truncated?)"
        if check_hashes and sha256_file(p) != ent.sha256:
            return False, f"{name} sha256 mismatch (corrupt)"
    return True, ""


def manifest_run(dirpath: str) -> str | None:
    """The run id in ``dirpath``'s manifest lineage, or None (no/unreadable manifest, no
    lineage). Read tolerant: a manifest that does not verify still names its run."""
    try:
        with open(os.path.join(dirpath, MANIFEST)) as f:
            man = decode(CheckpointManifest, json.load(f), what=MANIFEST, tolerant=True,
                         format=0, step=-1, files={}, lineage=None)
    except (OSError, ValueError):
        return None
    return (man.lineage.run or None) if man.lineage else None


def list_checkpoints(root: str, *, check_hashes: bool = True,
                     promote: bool = True) -> list[CkptInfo]:
    """Every ``step_N`` dir under ``root``, newest first, each with valid/why-not and its run.
    Orphans of a crash mid-swap are promoted first (``promote_orphans``) unless ``promote``
    is False (a look that changes nothing: ``dfo launch --dry-run``)."""
    if not os.path.isdir(root):
        return []
    try:
        if promote:
            promote_orphans(root)
    except OSError as e:  # a read-only dir: list what is there
        log.debug("promote_orphans(%s): %s", root, e)
    out = []
    for name in os.listdir(root):
        m = STEP_RE.match(name)
        if not m:
            continue
        step = int(m.group(1))
        path = os.path.join(root, name)
        ok, why = verify(path, expect_step=step, check_hashes=check_hashes)
        out.append(CkptInfo(name, step, path, ok, why, manifest_run(path)))
    out.sort(key=lambda c: c.step, reverse=True)
    return out


def newest_of_run(root: str, run_id: str) -> tuple[CkptInfo | None, list[CkptInfo]]:
    """(newest valid checkpoint written by run ``run_id`` or None, the newer invalid ones of
    this run or of unknown run that were skipped). Other runs' checkpoints are never chosen."""
    skipped: list[CkptInfo] = []
    for c in list_checkpoints(root):
        if c.valid and c.run == run_id:
            return c, skipped
        if not c.valid and c.run in (run_id, None):
            skipped.append(c)
    return None, skipped


def aside_dirs(root: str) -> list[str]:
    """The copies of ``root`` that a launch with ``--new-lineage`` moved aside
    (``<root>.<UTC stamp>``), newest first."""
    parent, base = os.path.split(os.path.normpath(root))
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    return [os.path.join(parent, n) for n in sorted(names, reverse=True)
            if n.startswith(base + ".") and os.path.isdir(os.path.join(parent, n))]


def _runs_in(root: str) -> set[str | None]:
    try:
        names = os.listdir(root)
    except OSError:
        return set()
    return {manifest_run(os.path.join(root, n)) for n in names if STEP_RE.match(n)}


def run_dir_of(root: str, run_id: str) -> str | None:
    """Where run ``run_id``'s checkpoints are: ``root`` when a manifest there names it (or
    when no manifest there names any run), else the moved-aside copy of ``root`` that holds
    them; None when neither does (``root`` holds other runs' checkpoints only, or none)."""
    here = _runs_in(root)
    if run_id in here:
        return root
    for d in aside_dirs(root):
        if run_id in _runs_in(d):
            return d
    return root if here and here <= {None} else None


def moved_checkpoint(path: str, run_id: str) -> str | None:
    """``path`` (``<root>/step_N``, written by ``run_id``) where it is now: itself while it
    is there, else the same ``step_N`` in the moved-aside copy of ``root`` whose manifest
    names ``run_id``; None when it is nowhere."""
    if os.path.isdir(path) and manifest_run(path) in (run_id, None):
        return path
    root, name = os.path.split(os.path.normpath(path))
    for d in aside_dirs(root):
        p = os.path.join(d, name)
        if os.path.isdir(p) and manifest_run(p) == run_id:
            return p
    return None


def newest_valid(root: str) -> tuple[CkptInfo | None, list[CkptInfo]]:
    """(newest valid checkpoint or None, the newer invalid ones that were skipped)."""
    skipped: list[CkptInfo] = []
    for c in list_checkpoints(root):
        if c.valid:
            return c, skipped
        skipped.append(c)
    return None, skipped


def resolve(root: str, spec: str) -> str:
    """``latest`` | ``step_N`` | a path -> a verified checkpoint directory, or CheckpointError.

    ``latest`` skips torn/corrupt checkpoints, warning (logger "dfo") with each one's name.
    """
    if spec == "latest":
        best, skipped = newest_valid(root)
        for c in skipped:
            log.warning("checkpoint %s skipped: %s", c.path, c.reason)
        if best is None:
            why = f"; skipped: {', '.join(f'{c.name} ({c.reason})' for c in skipped)}" if skipped else ""
            raise CheckpointError(f"checkpoint: --resume latest: no valid checkpoint in {root}{why} "
                                  "(start without --resume, or point --checkpoint.dir at the run's checkpoints)")
        return best.path
    if STEP_RE.match(spec) and not os.path.isabs(spec):
        path = os.path.join(root, spec)
    else:
        path = spec
    m = STEP_RE.match(os.path.basename(os.path.normpath(path)))
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint: --resume {spec}: {path} does not exist "
                              f"(python -m dfo_contract.checkpoints list {root} shows what does)")
    ok, why = verify(path, expect_step=int(m.group(1)) if m else None)
    if not ok:
        raise CheckpointError(f"checkpoint: --resume {spec}: {path} is not usable: {why} "
                              "(use --resume latest to take the newest valid one)")
    return path


def read_manifest(dirpath: str) -> dict:
    with open(os.path.join(dirpath, MANIFEST)) as f:
        return json.load(f)


def _dead_orphans(root: str) -> list[tuple[int, str, str]]:
    """(step, kind, path) of ``.step_N.tmp-PID`` / ``.step_N.old-PID`` dirs of dead writers."""
    out = []
    for name in os.listdir(root):
        m = ORPHAN_RE.match(name)
        if m and not pid_alive(int(m.group(3))):
            out.append((int(m.group(1)), m.group(2), os.path.join(root, name)))
    return out


def promote_orphans(root: str) -> list[str]:
    """A dead writer's complete ``.step_N.tmp-PID`` (preferred: the newer state) or
    ``.step_N.old-PID`` where no ``step_N`` exists is renamed to ``step_N``. Returns the new paths."""
    if not os.path.isdir(root):
        return []
    promoted = []
    orphans = sorted(_dead_orphans(root), key=lambda o: (o[0], o[1] != "tmp", o[2]))
    for step, _kind, path in orphans:
        final = os.path.join(root, f"step_{step}")
        if os.path.lexists(final) or not verify(path, expect_step=step, check_hashes=True)[0]:
            continue
        os.rename(path, final)
        log.warning("checkpoint %s promoted to %s (its writer died mid-save)", path, final)
        promoted.append(final)
    return promoted


def stale_tmp_dirs(root: str) -> list[str]:
    """``.step_N.tmp-<pid>`` / ``.step_N.old-<pid>`` dirs whose writer process is gone and
    that are safe to delete: never a complete one with no ``step_N`` beside it (promote it)."""
    out: list[str] = []
    if not os.path.isdir(root):
        return out
    for step, _kind, path in _dead_orphans(root):
        if (not os.path.lexists(os.path.join(root, f"step_{step}"))
                and verify(path, expect_step=step, check_hashes=False)[0]):
            continue  # the only copy of step_N: promote_orphans' job, not deletion
        out.append(path)
    return out


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None, *, prog: str = "python -m dfo_contract.checkpoints") -> int:
    ap = argparse.ArgumentParser(prog=prog)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("list", help="list step_N checkpoints, valid or why not")
    lp.add_argument("dir")
    lp.add_argument("--json", action="store_true")
    lp.add_argument("--no-hash", action="store_true", help="check sizes only (fast)")
    lp.add_argument("--no-promote", action="store_true",
                    help="leave a dead writer's complete temp dir as it is (change nothing)")
    lp.add_argument("--run", default=None, metavar="ID",
                    help="only run ID's checkpoints, from DIR or the copy of DIR they were "
                         "moved aside to (run_dir_of); \"dir\" says which, null: none")
    a = ap.parse_args(argv)
    d: str | None = a.dir
    if a.run:
        d = run_dir_of(a.dir, a.run)
    infos = list_checkpoints(d, check_hashes=not a.no_hash, promote=not a.no_promote) if d else []
    if a.run:
        infos = [c for c in infos if c.run in (a.run, None)]
    if a.json:
        best = next((c for c in infos if c.valid), None)
        obj: dict[str, Any] = {"dir": d, "latest": best.name if best else None,
               "checkpoints": [c.to_json() for c in infos]}
        if a.run:
            obj["runs_in_dir"] = sorted(r for r in _runs_in(a.dir) if r)
        print(json.dumps(obj))
        return 0
    if not infos:
        print(f"no step_N checkpoints in {a.dir}")
        return 0
    for c in infos:
        print(f"{c.name:>14}  {'valid' if c.valid else 'INVALID: ' + c.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
