"""One C++ build per distinct kernel in a test run (tests only).

Inductor on CPU compiles every kernel it generates with g++ (``$CXX``), in one command
that compiles and links a shared object. The tests compile the same tiny models again and
again, each into a cache directory of its own (they test cold caches, one run's cache
against another's), so the same kernel sources are built many times: g++ was about half the
wall time of the compile tests. ``install`` puts a ``g++`` in the run-shared directory that
keeps each successful build's output under a key of its command line, where every input
file that exists counts by its content and the output path does not count; the same build
asked again is copied from there. Inductor's own caches, which the tests check, see the
same files and counters as with g++ itself: what they miss is still compiled, only the
compiler's work is reused. ``DFO_TEST_CXX_CACHE=0`` turns it off.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from tests.helpers.shared import locked

SCRIPT = r"""#!/bin/bash
# g++ with a cache of whole builds, keyed by the command line with each existing input
# file's content in place of its path (tests/helpers/cxx_cache.py).
real=@REAL@
store=@STORE@
out="" key="" prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out=$a; key+=$'\n-o OUT'
  elif [ "$a" != "-o" ] && [ -f "$a" ]; then key+=$'\n'"file $(sha256sum < "$a")"
  elif [ "$a" != "-o" ]; then key+=$'\n'"$a"
  fi
  prev=$a
done
[ -n "$out" ] && [ -n "$key" ] || exec "$real" "$@"
k=$(printf '%s' "$key" | sha256sum | cut -c1-40)
if [ -f "$store/$k" ]; then
  cp "$store/$k" "$out.cxx-cache.$$" && mv -f "$out.cxx-cache.$$" "$out" && exit 0
fi
"$real" "$@" || exit
cp "$out" "$store/.$k.$$" 2>/dev/null && mv -f "$store/.$k.$$" "$store/$k"
exit 0
"""


def install(shared: Path) -> str | None:
    """The caching ``g++`` of this run (made once), or None where it does not apply (turned
    off, ``$CXX`` already chosen, no g++)."""
    if os.environ.get("DFO_TEST_CXX_CACHE", "1") == "0" or os.environ.get("CXX"):
        return None
    real = shutil.which("g++")
    if real is None or shutil.which("sha256sum") is None:
        return None
    d = shared / "cxx"
    script = d / "g++"
    with locked(shared, "cxx"):
        if not script.exists():
            (d / "store").mkdir(parents=True, exist_ok=True)
            tmp = d / ".g++.partial"
            tmp.write_text(SCRIPT.replace("@REAL@", shlex.quote(real))
                           .replace("@STORE@", shlex.quote(str(d / "store"))))
            tmp.chmod(0o755)
            os.rename(tmp, script)
    return str(script)
