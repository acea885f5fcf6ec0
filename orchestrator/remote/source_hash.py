"""Hash the source of installed packages: ``python -m orchestrator.remote.source_hash PKG...``.

Prints ``{relative path: sha256}`` of each package's ``.py`` files as one JSON object,
without importing the packages (no torch import, fast). With one package the paths are
relative to it; with several each path starts with its package's name
(``trainer/core/step.py``, ``dfo_contract/fsio.py``). A package that is not installed: prints
``{"error": ...}`` and exits 3. ``plan.cache_key.source_hash`` combines the reply into the
``trainer.source`` component of the cache key. Needs only the stdlib and ``dfo_contract``
(both in every deployed env).
"""

import importlib.util
import json
import os
import sys

from dfo_contract.fsio import sha256_file

DEFAULT_PACKAGES = ("trainer", "dfo_contract")


def package_root(pkg: str):
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def hash_tree(root: str) -> dict:
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root).replace(os.sep, "/")] = sha256_file(p)
    return out


def hash_packages(packages) -> dict:
    """``{path: sha256}`` (see the module doc); ``{"error": ...}`` when one is missing."""
    out = {}
    for pkg in packages:
        root = package_root(pkg)
        if root is None:
            return {"error": "package %s not found" % pkg}
        tree = hash_tree(root)
        if len(packages) == 1:
            return tree
        out.update({pkg + "/" + rel: h for rel, h in tree.items()})
    return out


def main(argv: list) -> int:
    reply = hash_packages(list(argv) or list(DEFAULT_PACKAGES))
    print(json.dumps(reply, sort_keys=True))
    return 3 if "error" in reply else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
