"""The compile-cache helper run on a host: ``python -c SOURCE OP ARGS...``.

Ops (every value is an argv element, never part of the script):

``hashdir DIR``        ``{"files": {rel: {"sha256", "size"}}, "other": [rel...]}`` (symlinks and
                       special files are listed in ``other``, never followed)
``hashfile FILE``      ``{"sha256", "size"}``
``status CACHE_ROOT``  ``{"live", "snapshots", "used", "stale"}`` (see ``ops.snapshot``)

A missing DIR/FILE answers ``{"missing": true}``. Prints one JSON object. Its source travels
as the script text (it may run with a system ``python3`` that has no dfo), so it stays
stdlib-only and self-contained.
"""

import hashlib
import json
import os
import sys


def hash_file(path: str) -> dict:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
    return {"sha256": h.hexdigest(), "size": n}


def hash_dir(root: str) -> dict:
    files, other = {}, []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        for name in list(dirs):
            if os.path.islink(os.path.join(d, name)):
                other.append(os.path.relpath(os.path.join(d, name), root))
        for name in sorted(names):
            p = os.path.join(d, name)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            if os.path.islink(p) or not os.path.isfile(p):
                other.append(rel)
                continue
            files[rel] = hash_file(p)
    return {"files": files, "other": other}


def du(path: str) -> int:
    n = 0
    for d, _dirs, names in os.walk(path):
        for name in names:
            try:
                n += os.lstat(os.path.join(d, name)).st_size
            except OSError:
                pass
    return n


def _snapshot(snaps: str, key: str, manifest: str) -> dict:
    ent: dict = {"mtime": os.stat(manifest).st_mtime}
    try:
        with open(manifest) as f:
            m = json.load(f)
        ent["created"] = m.get("created")
        ent["total"] = (m.get("sizes") or {}).get("total")
        ent["warmup"] = m.get("warmup")
    except Exception as e:  # noqa: BLE001 - a broken manifest is reported, not fatal
        ent["error"] = type(e).__name__
    t = os.path.join(snaps, key + ".tar")
    ent["tar_size"] = os.path.getsize(t) if os.path.isfile(t) else None
    return ent


def status(root: str) -> dict:
    out: dict = {"live": {}, "snapshots": {}, "used": {}, "stale": []}
    if not os.path.isdir(root):
        return out
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        if name in ("snapshots", ".gens", ".used"):
            continue
        if name.startswith("."):
            out["stale"].append(name)
            continue
        if os.path.isdir(p):
            real = os.path.realpath(p)
            out["live"][name] = {"size": du(real), "mtime": os.stat(real).st_mtime,
                                 "target": real, "link": os.path.islink(p)}
    gens = os.path.join(root, ".gens")
    if os.path.isdir(gens):
        live_targets = {v["target"] for v in out["live"].values()}
        for name in sorted(os.listdir(gens)):
            if os.path.realpath(os.path.join(gens, name)) not in live_targets:
                out["stale"].append(".gens/" + name)
    snaps = os.path.join(root, "snapshots")
    if os.path.isdir(snaps):
        for name in sorted(os.listdir(snaps)):
            if name.startswith("."):
                out["stale"].append("snapshots/" + name)
            elif name.endswith(".manifest.json"):
                key = name[: -len(".manifest.json")]
                out["snapshots"][key] = _snapshot(snaps, key, os.path.join(snaps, name))
    used = os.path.join(root, ".used")
    if os.path.isdir(used):
        for name in os.listdir(used):
            out["used"][name] = os.stat(os.path.join(used, name)).st_mtime
    return out


def run(op: str, args: list) -> dict:
    """One op's reply (see the module doc)."""
    if op == "hashdir":
        return hash_dir(args[0]) if os.path.isdir(args[0]) else {"missing": True}
    if op == "hashfile":
        return hash_file(args[0]) if os.path.isfile(args[0]) else {"missing": True}
    if op == "status":
        return status(args[0])
    return {"error": "unknown op %s" % op}


def main(argv: list) -> int:
    if not argv:
        reply: dict = {"error": "usage: cache_tool OP ARGS..."}
    else:
        reply = run(argv[0], argv[1:])
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
