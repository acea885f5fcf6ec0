"""Fetch one wheel into a cache directory, checked against the sha256 a lock pins.

    python scripts/fetch_wheel.py URL CACHE_DIR FILENAME SHA256

scripts/test.sh uses it for torch's +cpu wheel, which PyPI does not serve. The file is
written under a temporary name and renamed only once its hash matches, so the cache never
holds a partial or unrelated file. Exit 0 with the path on stdout; exit 2 with one line
naming the URL and the cause on stderr. Standard library only (it runs before any venv).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.request


def fetch(url: str, cache: str, name: str, want: str, timeout: float = 120.0) -> str:
    os.makedirs(cache, exist_ok=True)
    dest = os.path.join(cache, name)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".part-")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        got = h.hexdigest()
        if got != want:
            raise ValueError(f"sha256 {got[:12]}... is not the lock's {want[:12]}...")
        os.replace(tmp, dest)
        return dest
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: fetch_wheel.py URL CACHE_DIR FILENAME SHA256", file=sys.stderr)
        return 2
    url, cache, name, want = argv
    try:
        print(fetch(url, cache, name, want))
    except Exception as e:  # one line, never a traceback: the caller names the fix
        print(f"fetch_wheel: {url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
