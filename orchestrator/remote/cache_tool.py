"""The compile-cache helper run on a host: ``python -c SOURCE OP ARGS...``.

Ops (every value is an argv element, never part of the script):

``hashdir DIR``        ``{"files": {rel: {"sha256", "size"}}, "other": [rel...]}`` (symlinks and
                       special files are listed in ``other``, never followed)
``hashfile FILE``      ``{"sha256", "size"}``
``unpack TAR DEST``    check every member of TAR (only regular files and directories under
                       ``inductor/ triton/ mega/``, relative, no ``..``), then extract into DEST
                       without ever following a link or writing outside it, and answer as
                       ``hashdir DEST``; a forbidden member answers ``{"refused": "..."}`` and
                       nothing is written
``scantar TAR``        ``{"members": N}`` or ``{"refused": "..."}`` (the first forbidden member)
``hostname``           ``{"hostname": ...}`` (the machine's name, for a snapshot's provenance)
``status CACHE_ROOT [verify]``  ``{"live", "snapshots", "used", "stale"}`` (see ``plan.snapshot``);
                       with ``verify`` each snapshot also carries its parsed ``manifest``, its
                       tar's observed ``{"sha256", "size"}`` as ``tar`` and ``refused``, and
                       each live cache its ``damaged`` files (``[[rel, why], ...]``)
``scrub DIR``          delete the files of DIR that cannot be loaded (``bad_artifact``):
                       ``{"dropped": [[rel, why], ...]}``

A missing DIR/FILE answers ``{"missing": true}``. Prints one JSON object: the laptop reads
each op's reply as its record of ``dfo_contract.cache_records`` (``HashFileReply``,
``HashDirReply``, ``UnpackReply``, ``ScanReply``, ``HostnameReply``, ``CacheStatusReply``,
``ScrubReply``). Its source travels as the script text (it may run with a system ``python3``
that has no dfo), so it stays stdlib-only and self-contained and writes those shapes itself.
"""

import hashlib
import json
import os
import socket
import sys
import tarfile

#: the only top-level directories a snapshot may hold
CACHE_SUBDIRS = ("inductor", "triton", "mega")
#: an ELF file is at least its 64-byte header (ELF64)
ELF_MAGIC = b"\x7fELF"
ELF_HEADER = 64
#: a cache file whose name ends so is loaded as code
SHARED = (".so",)
#: a cache file whose name ends so is empty by design (inductor's ``locks/*.lock``: only
#: ``flock``ed, never read)
LOCKS = (".lock",)


def bad_artifact(name: str, size: int, head: bytes) -> "str | None":
    """Why a compile-cache file cannot be kept (None: keep it): empty, or a shared object
    that is not a whole ELF file. torch and triton do not write every entry by rename: a
    compile killed mid-write leaves such files, which the next load fails on."""
    if size == 0:
        return None if name.endswith(LOCKS) else "empty"
    if name.endswith(SHARED):
        if not head.startswith(ELF_MAGIC):
            return "not an ELF shared object"
        if size < ELF_HEADER:
            return "a shared object of %d bytes (cut short)" % size
    return None


def damaged(root: str, delete: bool = False) -> list:
    """``[[rel, why], ...]`` for each regular file under ``root`` that cannot be kept
    (links are never followed); ``delete``: also delete each (one that cannot be deleted
    is not listed)."""
    out = []
    for d, _dirs, names in os.walk(root):
        for name in sorted(names):
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                with open(p, "rb") as f:
                    head = f.read(4)
            except OSError:
                continue
            why = bad_artifact(name, st.st_size, head)
            if not why:
                continue
            if delete:
                try:
                    os.unlink(p)
                except OSError:
                    continue
            out.append([os.path.relpath(p, root).replace(os.sep, "/"), why])
    return out


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


def _kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return "a symlink (to %s)" % m.linkname
    if m.islnk():
        return "a hard link (to %s)" % m.linkname
    if m.isfifo():
        return "a fifo"
    if m.ischr() or m.isblk():
        return "a device"
    return "a special member (type %r)" % m.type


def member_problem(m: tarfile.TarInfo) -> "str | None":
    """Why a snapshot may not hold this tar member (None: a regular file or a directory
    with a relative name under inductor/ triton/ mega/)."""
    name = m.name
    if not (m.isreg() or m.isdir()):
        return "%s is %s; a snapshot holds only regular files and directories" % (name, _kind(m))
    if name.startswith("/"):
        return "%s has an absolute name" % name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "%s has '..' in its name" % name
    if not parts or parts[0] not in CACHE_SUBDIRS:
        return "%s is not under %s" % (name, "/ ".join(CACHE_SUBDIRS) + "/")
    return None


def _members(tf: tarfile.TarFile) -> "tuple[list[tarfile.TarInfo], str | None]":
    out: "list[tarfile.TarInfo]" = []
    for m in tf:
        why = member_problem(m)
        if why:
            return out, "member " + why
        out.append(m)
    return out, None


def scan_tar(path: str) -> dict:
    """``{"members": N}`` or ``{"refused": why}`` (the first forbidden member, or an
    unreadable/truncated tar). Reads headers only."""
    try:
        with tarfile.open(path, "r:") as tf:
            members, why = _members(tf)
    except (tarfile.TarError, EOFError, OSError) as e:
        return {"refused": "not a readable tar (%s)" % (str(e) or type(e).__name__)}
    if why:
        return {"refused": why}
    # reading headers skips data and takes a cut-off header for the end: a whole tar ends
    # with two zero blocks after its last member's data
    end = 0
    if members:
        last = members[-1]
        end = last.offset_data + (-(-last.size // 512) * 512 if last.isreg() else 0)
    with open(path, "rb") as f:
        f.seek(end)
        tail = f.read(1024)
    if len(tail) < 1024 or tail.strip(b"\0"):
        return {"refused": "not a readable tar (it ends without the end-of-archive blocks: "
                           "truncated)"}
    return {"members": len(members)}


def unpack(path: str, dest: str) -> dict:
    """Check every member first; then extract into ``dest`` (an empty directory): only
    directories and regular files are made, files with O_EXCL|O_NOFOLLOW, and every path
    is checked to stay inside ``dest``. Answers like ``hash_dir(dest)``."""
    scan = scan_tar(path)
    if "refused" in scan:
        return scan
    try:
        return _extract(path, os.path.realpath(dest))
    except OSError as e:
        return {"refused": "cannot extract %s: %s" % (e.filename or path, e.strerror or e)}


def _extract(path: str, base: str) -> dict:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            rel = "/".join(p for p in m.name.split("/") if p not in ("", "."))
            target = os.path.join(base, rel)
            parent = target if m.isdir() else os.path.dirname(target)
            os.makedirs(parent, exist_ok=True)
            real_parent = os.path.realpath(parent)
            if real_parent != base and not real_parent.startswith(base + os.sep):
                return {"refused": "member %s would be written outside the cache dir" % m.name}
            if m.isdir():
                continue
            src = tf.extractfile(m)
            if src is None:  # member_problem lets only directories and regular files through
                return {"refused": "member %s is not a regular file" % m.name}
            try:
                fd = os.open(target, flags, 0o755 if m.mode & 0o111 else 0o644)
            except FileExistsError:
                return {"refused": "member %s appears twice" % m.name}
            with os.fdopen(fd, "wb") as out:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    out.write(b)
            os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)
    return hash_dir(base)


def hostname() -> dict:
    return {"hostname": socket.gethostname()}


def du(path: str) -> int:
    n = 0
    for d, _dirs, names in os.walk(path):
        for name in names:
            try:
                n += os.lstat(os.path.join(d, name)).st_size
            except OSError:
                pass
    return n


def _snapshot(snaps: str, key: str, manifest: str, verify: bool = False) -> dict:
    ent: dict = {"mtime": os.stat(manifest).st_mtime}
    try:
        with open(manifest) as f:
            m = json.load(f)
        if not isinstance(m, dict):
            raise ValueError("not a JSON object")
        ent["created"] = m.get("created")
        ent["total"] = (m.get("sizes") or {}).get("total")
        ent["warmup"] = m.get("warmup")
        ent["provenance"] = m.get("provenance")
        if verify:
            ent["manifest"] = m
    except Exception as e:  # noqa: BLE001 - a broken manifest is reported, not fatal
        ent["error"] = type(e).__name__
    t = os.path.join(snaps, key + ".tar")
    ent["tar_size"] = os.path.getsize(t) if os.path.isfile(t) else None
    if verify:
        if os.path.isfile(t):
            ent["tar"] = hash_file(t)
            ent["refused"] = scan_tar(t).get("refused")
        else:
            ent["tar"] = {"missing": True}
    return ent


def status(root: str, verify: bool = False) -> dict:
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
            if verify:
                out["live"][name]["damaged"] = damaged(real)
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
                out["snapshots"][key] = _snapshot(snaps, key, os.path.join(snaps, name), verify)
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
    if op == "unpack":
        if not os.path.isfile(args[0]):
            return {"missing": True}
        return unpack(args[0], args[1])
    if op == "scantar":
        return scan_tar(args[0]) if os.path.isfile(args[0]) else {"missing": True}
    if op == "hostname":
        return hostname()
    if op == "scrub":
        if not os.path.isdir(args[0]):
            return {"missing": True}
        return {"dropped": damaged(args[0], delete=True)}
    if op == "status":
        return status(args[0], verify=args[1:] == ["verify"])
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
