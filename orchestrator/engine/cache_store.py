"""The compile-cache store of one host, through its transport (``CacheStore``): the env's
python and cache helper, the key's paths, the live generation (read and switched with one
rename of a symlink), and the snapshot store's commit. ``CacheManager`` (``compile_cache``)
and its ``CacheWarmup`` (``cache_warmup``) are each given the one ``CacheStore`` of the host.

Every remote command is an argv list (``test``, ``readlink``, ``mv``, ``ln``, ``rm``,
``mkdir``, ``touch`` and the env's python running ``orchestrator.remote.cache_tool``)."""

from __future__ import annotations

import posixpath
import secrets
import time
from typing import Sequence, TypeVar

from dfo_contract.cache_records import HostnameReply, Manifest
from dfo_contract.env_fingerprint import EnvFingerprint

from ..common.errors import DeployError, NotFoundError, RemoteCommandError
from ..plan import snapshot as sn
from ..plan.fingerprint import parse_fingerprint
from ..config.host_tree import HostTree
from ..transport.base import Transport

R = TypeVar("R")


class CacheStore:
    """The host's cache store: ``transport``, ``tree`` (its paths), ``host`` (its name in
    messages), ``timeout`` (of each remote command)."""

    def __init__(self, transport: Transport, tree: HostTree, host: str, *,
                 timeout: float | None = None):
        self.transport = transport
        self.tree = tree
        self.host = host
        self.timeout = timeout
        self._machine: str | None = None

    # -- the env and its cache helper ------------------------------------------------------
    @property
    def python(self) -> str:
        return self.tree.current_python

    def helper_python(self) -> str:
        """The env's python, or the host's ``python3`` where no env is deployed (the cache
        helper is stdlib only)."""
        return self.python if self._exists_file(self.python) else "python3"

    @property
    def machine(self) -> str | None:
        """The host machine's own name (``socket.gethostname()`` there), asked once."""
        if self._machine is None:
            r = self.transport.run(sn.tool_argv(self.helper_python(), "hostname"),
                                   timeout=self.timeout)
            self._machine = sn.parse_tool(r.out, "cache helper hostname",
                                          HostnameReply).hostname if r.ok else ""
        return self._machine or None

    def fingerprint(self) -> EnvFingerprint:
        """envs/current's fingerprint.json (DeployError when no env is deployed)."""
        path = posixpath.join(self.tree.current_env, "fingerprint.json")
        try:
            data = self.transport.get(path)
        except (NotFoundError, RemoteCommandError):
            raise DeployError(f"no deployed env on {self.host} ({path} missing)",
                              hint="run `dfo deploy` first") from None
        try:
            return parse_fingerprint(data)
        except ValueError:
            raise DeployError(f"{path} on {self.host} is not valid JSON",
                              hint="redeploy with `dfo deploy`") from None

    # -- small remote steps ----------------------------------------------------------------
    def run(self, argv: Sequence[str], what: str, **kw) -> str:
        """Run ``argv`` on the host; its output (RemoteCommandError naming ``what``)."""
        return self.transport.run(list(argv), check=False, timeout=self.timeout, **kw).check(what).out

    def tool(self, op: str, *args: str, reply: type[R]) -> R:
        """The env's cache helper ``op`` (``orchestrator.remote.cache_tool``): its ``reply``
        record (``dfo_contract.cache_records``)."""
        r = self.transport.run(sn.tool_argv(self.python, op, *args), timeout=self.timeout)
        if not r.ok:
            r.check(f"cache helper {op}")
        return sn.parse_tool(r.out, f"cache helper {op}", reply)

    def helper(self, op: str, *args: str, reply: type[R], what: str) -> R:
        """The cache helper ``op`` run by :meth:`helper_python` (also where no env is
        deployed): its ``reply`` record; ``what`` names it in errors."""
        r = self.transport.run(sn.tool_argv(self.helper_python(), op, *args), timeout=self.timeout)
        r.check(what)
        return sn.parse_tool(r.out, what, reply)

    def _exists_dir(self, path: str) -> bool:
        return self.transport.run(["test", "-d", path], timeout=self.timeout).ok

    def _exists_file(self, path: str) -> bool:
        return self.transport.run(["test", "-f", path], timeout=self.timeout).ok

    def rm(self, *paths: str) -> None:
        if paths:
            self.transport.run(["rm", "-rf", "--", *paths], timeout=self.timeout)

    def stamp(self) -> str:
        """A new generation's name suffix: the time and a random tag."""
        return f"{int(time.time())}-{secrets.token_hex(3)}"

    def paths(self, key: str) -> sn.CachePaths:
        return sn.paths(self.tree, key)

    # -- the live generation ---------------------------------------------------------------
    def live_target(self, p: sn.CachePaths) -> str | None:
        r = self.transport.run(["readlink", "-f", "--", p.live], timeout=self.timeout)
        if not r.ok or not self._exists_dir(p.live):
            return None
        return r.out.strip() or None

    def switch(self, p: sn.CachePaths, gen: str, stamp: str) -> None:
        """Make ``gen`` the live cache of the key: one rename of a symlink."""
        old = self.live_target(p)
        if old is None and self._exists_dir(p.live):  # a plain directory from elsewhere
            old = p.live + f".old-{stamp}"
            self.run(["mv", "-T", "--", p.live, old], "moving the old cache aside")
        tmp = p.link_tmp(stamp)
        self.run(["ln", "-sfn", "--", gen, tmp], "linking the new cache")
        self.run(["mv", "-Tf", "--", tmp, p.live], "switching the live cache")
        if old and old != gen:
            self.rm(old)
        self._touch_used(p)

    def _touch_used(self, p: sn.CachePaths) -> None:
        self.transport.run(["mkdir", "-p", "--", posixpath.dirname(p.used)], timeout=self.timeout)
        self.transport.run(["touch", "--", p.used], timeout=self.timeout)

    # -- the snapshot store ----------------------------------------------------------------
    def read_manifest(self, p: sn.CachePaths) -> Manifest | None:
        """The stored snapshot's manifest of ``p``'s key; None when there is none."""
        if not self._exists_file(p.manifest):
            return None
        return sn.parse_manifest(self.transport.get(p.manifest), f"{self.host}:{p.manifest}")

    def commit(self, p: sn.CachePaths, tmp: str, m: Manifest) -> None:
        """Commit the verified tar at ``tmp`` into the store: the old manifest goes first
        (from then on no snapshot exists for the key), the tar takes its name with one
        rename, and the new manifest comes last."""
        try:
            self.rm(p.manifest)
            self.run(["mv", "-f", "--", tmp, p.tar], "storing the snapshot")
        except BaseException:
            self.rm(tmp)
            raise
        self.transport.put(sn.manifest_bytes(m), p.manifest, mode=0o644)
