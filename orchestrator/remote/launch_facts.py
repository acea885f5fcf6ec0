"""The facts ``dfo launch`` needs Python for, in the deployed env, as one JSON line:
``python -m orchestrator.remote.launch_facts [--fingerprint F] [--source] [--hash F]...
[--ckpt DIR]... [--no-promote] [--glob PATTERN] [--caches DIR]``.

``scripts/launch_facts.sh`` runs it inside launch's one pre-launch round trip. It reads,
it never writes (with ``--no-promote``, not even a dead writer's checkpoint is promoted):

- ``fingerprint``: the env's ``fingerprint.json`` (a cache-key input), or null
- ``source``: ``{path: sha256}`` of the deployed trainer and dfo_contract source (the
  ``trainer.source`` cache-key input, ``orchestrator.remote.source_hash``)
- ``hashes``: ``{file: sha256 or null}`` (the target model's ``config.json``)
- ``checkpoints``: ``{dir: [CkptInfo...]}`` by manifest: names, steps, sizes and lineage,
  no weights re-hashed (the trainer verifies the one it resumes, hashes included)
- ``glob``: ``[[path, mtime], ...]`` matches of your own trainer's resume glob
- ``caches``: the names of the live compile caches (``cache/<key>``)

A part that fails answers ``{"error": ...}`` in its place; the others still answer.
"""

from __future__ import annotations

import argparse
import glob as globmod
import json
import os
import sys

from dfo_contract.checkpoints import list_checkpoints
from dfo_contract.fsio import sha256_file

from .source_hash import DEFAULT_PACKAGES, hash_packages

MARK = "@dfo-facts "


def _fingerprint(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _hash(path: str):
    return sha256_file(path) if os.path.isfile(path) else None


def _matches(pattern: str) -> list:
    out = []
    for p in globmod.glob(pattern):
        try:
            out.append([p, os.stat(p).st_mtime])
        except OSError:
            pass
    return out


def _caches(root: str) -> list:
    try:
        return sorted(n for n in os.listdir(root) if not n.startswith(".")
                      and os.path.isdir(os.path.join(root, n)))
    except OSError:
        return []


def _part(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
        return {"error": f"{type(e).__name__}: {e}"}


def facts(a: argparse.Namespace) -> dict:
    out: dict = {}
    if a.fingerprint:
        out["fingerprint"] = _part(_fingerprint, a.fingerprint)
    if a.source:
        out["source"] = _part(hash_packages, list(DEFAULT_PACKAGES))
    out["hashes"] = {p: _part(_hash, p) for p in a.hash}
    out["checkpoints"] = {d: _part(lambda d=d: [c.to_json() for c in list_checkpoints(
        d, check_hashes=False, promote=not a.no_promote)]) for d in a.ckpt}
    if a.glob is not None:
        out["glob"] = _part(_matches, a.glob)
    if a.caches:
        out["caches"] = _part(_caches, a.caches)
    return out


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.remote.launch_facts")
    ap.add_argument("--fingerprint")
    ap.add_argument("--source", action="store_true")
    ap.add_argument("--hash", action="append", default=[])
    ap.add_argument("--ckpt", action="append", default=[])
    ap.add_argument("--no-promote", action="store_true")
    ap.add_argument("--glob")
    ap.add_argument("--caches")
    a = ap.parse_args(argv)
    print(MARK + json.dumps(facts(a), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
