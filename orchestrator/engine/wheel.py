"""Build dfo's own wheel locally, cached by the content of its sources.

``dfo deploy`` ships this wheel into the env (``--no-deps``), so the supervisor and the
trainer inside the container are the same code as the local dfo. The cache key is the
sha256 of the source files (wheels themselves are not byte-reproducible: zip times),
so an unchanged tree reuses its wheel and any edit makes a new one.

Cache: ``$DFO_CACHE_DIR`` or ``$XDG_CACHE_HOME/dfo`` or ``~/.cache/dfo``, under
``wheels/<digest16>/``; a build goes to a temporary directory, then is renamed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dfo_contract.fsio import atomic_write_bytes, sha256_file

from .. import __version__
from ..common.errors import DeployError

log = logging.getLogger("dfo")

_PACKAGES = ("orchestrator", "trainer", "dfo_contract")
_TOP_FILES = ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in")
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class ProjectWheel:
    path: Path
    digest: str  # sha256 of the sources
    sha256: str  # sha256 of the wheel file
    version: str = __version__

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def short(self) -> str:
        """Names the wheel's directory on the target: the shipped file's own hash."""
        return self.sha256[:16]


def cache_dir() -> Path:
    if os.environ.get("DFO_CACHE_DIR"):
        return Path(os.environ["DFO_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "dfo"


def source_root() -> Path | None:
    """The source tree dfo runs from (holding pyproject.toml of project dfo), or None."""
    root = Path(__file__).resolve().parents[2]  # orchestrator/engine/wheel.py
    pp = root / "pyproject.toml"
    try:
        text = pp.read_text()
    except OSError:
        return None
    return root if 'name = "dfo"' in text else None


def install_extra_hint(extra: str) -> str:
    """The command that installs dfo's optional ``extra`` (``plot``) into the environment
    this dfo runs in, as it was installed: a checkout (``scripts/demo.sh``'s ``.venv``:
    ``.venv/bin/pip install -e '.[plot]'``, run in the checkout), else from a package index."""
    import sys

    root = source_root()
    prefix = Path(sys.prefix).resolve()
    if root is None:
        return f"{sys.executable} -m pip install 'dfo[{extra}]'"
    if prefix.parent == root:
        pip = prefix.relative_to(root) / "bin" / "pip"
        here = Path.cwd().resolve() == root
        return (f"{pip} install -e '.[{extra}]'" if here
                else f"cd {root} && {pip} install -e '.[{extra}]'")
    return f"{sys.executable} -m pip install -e '{root}[{extra}]'"


def _source_files(root: Path) -> list[Path]:
    files = [root / f for f in _TOP_FILES if (root / f).is_file()]
    for pkg in _PACKAGES:
        base = root / pkg
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS
                                 and not d.endswith(".egg-info"))
            for fn in sorted(filenames):
                if fn.endswith(_SKIP_SUFFIXES) or fn.startswith(".dfo-tmp"):
                    continue
                files.append(Path(dirpath) / fn)
    return files


def source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in _source_files(root):
        rel = f.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


_UV_LOCK = threading.Lock()
_UV_BIN: list[str] = []


def uv_bin() -> str:
    """The local uv binary (the `uv` Python package's, else uv on PATH), found once. Deploys
    of a group's hosts run in threads: ``uv.find_uv_bin`` reads ``sysconfig``, whose first
    use is not thread-safe (a TypeError when two threads make it at once), so the first
    caller finds it under a lock and the others take its answer."""
    with _UV_LOCK:
        if not _UV_BIN:
            _UV_BIN.append(_find_uv_bin())
        return _UV_BIN[0]


def _find_uv_bin() -> str:
    try:
        import uv  # the `uv` Python package, a dfo dependency

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise DeployError("uv is not installed on this machine",
                              hint="pip install uv (it is a dfo dependency)") from None
        return found


def from_file(path: Path) -> ProjectWheel:
    """A pre-built wheel (``$DFO_PROJECT_WHEEL``): its file hash stands for the sources."""
    path = Path(path).expanduser().resolve()
    if not path.is_file() or not path.name.startswith("dfo-") or path.suffix != ".whl":
        raise DeployError(f"DFO_PROJECT_WHEEL={path} is not a dfo wheel file",
                          hint="point it at a dfo-*.whl, or unset it to build from the checkout")
    sha = sha256_file(path)
    return ProjectWheel(path, sha, sha, version=path.name.split("-")[1])


def _can_build_here() -> bool:
    """True when this interpreter has a setuptools (>= 68, as pyproject asks) and ``wheel``
    able to build dfo without build isolation. A fresh venv's bundled setuptools is older
    and has no ``wheel``: then uv builds in an isolated env instead."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    try:
        from importlib.metadata import version

        major = int(version("setuptools").split(".")[0])
    except Exception:  # noqa: BLE001 - any doubt: let uv isolate the build
        return False
    return major >= 70 or (major >= 68 and importlib.util.find_spec("wheel") is not None)


def build(cache: Path | None = None) -> ProjectWheel:
    """The wheel for the current sources (built once per content), or the file named by
    ``$DFO_PROJECT_WHEEL`` (CI, or a dfo installed without its source tree)."""
    if os.environ.get("DFO_PROJECT_WHEEL"):
        return from_file(Path(os.environ["DFO_PROJECT_WHEEL"]))
    root = source_root()
    if root is None:  # dfo installed from a wheel: ship exactly the installed files
        return repack_installed(cache)
    digest = source_digest(root)
    out_dir = (cache or cache_dir()) / "wheels" / digest[:16]
    found = sorted(out_dir.glob("dfo-*.whl")) if out_dir.is_dir() else []
    if found:
        return ProjectWheel(found[0], digest, sha256_file(found[0]))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dfo-wheel-", dir=out_dir.parent) as tmp:
        src = Path(tmp) / "src"
        for f in _source_files(root):
            dest = src / f.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        dist = Path(tmp) / "dist"
        # no build isolation when setuptools is importable here: fast, and offline
        argv = [uv_bin(), "build", "--wheel", "--out-dir", str(dist), "--quiet"]
        if _can_build_here():
            argv += ["--no-build-isolation", "--python", sys.executable]
        argv.append(str(src))
        log.debug("building the dfo wheel: %s", argv)
        p = subprocess.run(argv, capture_output=True, text=True)
        wheels = sorted(dist.glob("dfo-*.whl"))
        if p.returncode != 0 or not wheels:
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise DeployError(f"building dfo's wheel failed: {last}",
                              hint="run `uv build --wheel` in the checkout to see why")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        shutil.move(str(wheels[0]), staged / wheels[0].name)
        try:
            os.rename(staged, out_dir)
        except OSError:
            if not out_dir.is_dir():  # lost a race with another build: theirs is as good
                raise
    whl = sorted(out_dir.glob("dfo-*.whl"))[0]
    return ProjectWheel(whl, digest, sha256_file(whl))


_DIST_INFO_KEEP = ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt")


def _record_hash(data: bytes) -> str:
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack_installed(cache: Path | None = None) -> ProjectWheel:
    """A wheel of the installed dfo distribution's own files (for a dfo installed without
    its source tree). Reproducible: sorted entries, fixed zip times, a fresh RECORD."""
    import importlib.metadata as md
    import zipfile

    try:
        dist = md.distribution("dfo")
    except md.PackageNotFoundError:
        raise DeployError("cannot find dfo's sources or its installed files to build its wheel",
                          hint="install dfo (pip install -e . in a checkout), or set "
                               "DFO_PROJECT_WHEEL to a dfo wheel") from None
    members: list[tuple[str, bytes]] = []
    for f in dist.files or []:
        rel = f.as_posix()
        parts = rel.split("/")
        if "__pycache__" in parts or rel.endswith(_SKIP_SUFFIXES) or rel.startswith(".."):
            continue
        if parts[0].endswith(".dist-info"):
            if len(parts) != 2 or parts[1] not in _DIST_INFO_KEEP and not parts[1].startswith("LICENSE"):
                continue
        elif parts[0] not in _PACKAGES:
            continue
        members.append((rel, Path(f.locate()).read_bytes()))
    members.sort()
    if not any(r.startswith(f"{p}/") for p in _PACKAGES for r, _ in members):
        raise DeployError("the installed dfo has no package files to ship (an editable install "
                          "without its checkout?)",
                          hint="reinstall dfo, or set DFO_PROJECT_WHEEL to a dfo wheel")
    h = hashlib.sha256()
    for rel, data in members:
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    digest = h.hexdigest()
    out_dir = (cache or cache_dir()) / "wheels" / f"installed-{digest[:16]}"
    name = f"dfo-{dist.version}-py3-none-any.whl"
    whl = out_dir / name
    if not whl.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        info_dir = next((r.split("/")[0] for r, _ in members if r.split("/")[0].endswith(".dist-info")),
                        f"dfo-{dist.version}.dist-info")
        record = [f"{rel},{_record_hash(data)},{len(data)}" for rel, data in members]
        record.append(f"{info_dir}/RECORD,,")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for rel, data in members + [(f"{info_dir}/RECORD", ("\n".join(record) + "\n").encode())]:
                zi = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                zi.external_attr = 0o644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(zi, data)
        atomic_write_bytes(whl, buf.getvalue())
    return ProjectWheel(whl, digest, sha256_file(whl), version=dist.version)
