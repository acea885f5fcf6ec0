"""A deploy's commands on one host (``DeployRunner``): each under the deploy's lease
(``flock`` on locks/deploy.lock) unless asked otherwise, with uv's settings (its cache
beside the envs, no downloads of python, no progress bars) and sources (find-links, index),
and its failures said as a deploy says them: a lost lease, run.lock held, uv's own errors
(``plan.uv``). ``Deployer`` (``deploy``) builds it once and gives it to its ``EnvSwitch``
(``deploy_switch``) and its ``DeployChecks`` (``deploy_check``)."""

from __future__ import annotations

import logging
import posixpath
from typing import Callable

from ..config.profiles import Sources
from ..common.errors import LockHeldError
from ..plan import deploy_plan as dp
from ..plan.uv import describe_sources, local_find_links, translate_uv_error
from ..plan.uv_progress import UvProgress
from .deploy_probe import SMALL_TIMEOUT
from .lease import DeployLease

log = logging.getLogger("dfo")


class DeployRunner:
    """Commands on ``host`` through ``transport`` under ``lease``; ``sources``: the
    profile's package sources, ``find_links``: ``dfo deploy --find-links``, ``environ``:
    the local environment (PIP_FIND_LINKS / UV_FIND_LINKS on ``local``); ``say(stage,
    line)``: a streamed command's progress."""

    def __init__(self, transport, host, *, lease: DeployLease, sources: Sources,
                 say: Callable[[str, str], None], find_links: tuple[str, ...] = (),
                 environ: dict[str, str] | None = None):
        self.transport = transport
        self.host = host
        self.tree = host.tree
        self.lease = lease
        self.sources = sources
        self.find_links = tuple(find_links)
        self.environ = dict(environ or {})
        self._say = say

    @property
    def uv_cache(self) -> str | None:
        """uv's cache on the target: ``<root>/uv-cache`` (beside the envs, so uv can hardlink
        from it); on the ``local`` transport, uv's own default (your usual cache)."""
        if self.transport.is_local:
            return None
        return posixpath.join(self.tree.root, "uv-cache")

    def _env(self) -> dict[str, str]:
        env = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
        if self.uv_cache:
            env["UV_CACHE_DIR"] = self.uv_cache
        return env

    def run(self, argv: list[str], *, timeout: float | None = SMALL_TIMEOUT, what: str,
            locked: bool = True, env: dict[str, str] | None = None) -> str:
        """Run ``argv`` on the host (under the deploy lease unless ``locked`` is off); its
        output, or the error a deploy says (lost lease, run.lock held, uv's own)."""
        if locked:
            argv = self.lease.locked(argv)
        r = self.transport.run(argv, env=env or self._env(), timeout=timeout)
        if r.exit_code != 0:
            if r.exit_code == dp.EXIT_BUSY and "deploy" in r.err:
                raise LockHeldError(f"lost the deploy lock on {self.host.name} while {what}: "
                                    f"{r.err.strip().splitlines()[-1]}",
                                    hint="another deploy took over; run dfo deploy again")
            if r.exit_code == dp.EXIT_BUSY and not r.err.strip():
                try:
                    owner = self.transport.get(self.tree.run_lock).decode("utf-8", "replace")
                except Exception:  # noqa: BLE001
                    owner = ""
                raise dp.run_lock_error(self.host.name, self.tree.root, owner)
            raise self._uv_error(r.err or r.out, what)
        return r.out

    def stream(self, stage: str, argv: list[str], *, what: str) -> None:
        """Run ``argv`` under the lease, each line (or uv's progress summary) said as
        ``stage``'s progress."""
        argv = self.lease.locked(argv)
        tail: list[str] = []
        progress = UvProgress()

        def on_line(line: str) -> None:
            tail.append(line)
            del tail[:-40]
            log.debug("%s: %s", stage, line)
            summary = progress.feed(line)
            if summary or line.strip():
                self._say(stage, (summary or line.strip())[:160])

        r = self.transport.stream(argv, on_line, env=self._env(), timeout=None)
        if r.exit_code != 0:
            text = "\n".join(tail)
            if r.exit_code == dp.EXIT_BUSY and "deploy" in text:
                raise LockHeldError(f"lost the deploy lock on {self.host.name} while {what}",
                                    hint="another deploy took over; run dfo deploy again")
            raise self._uv_error(text, what)

    def _uv_error(self, text: str, what: str):
        return translate_uv_error(text, host=self.host.name, root=self.tree.root, what=what,
                                  sources=describe_sources(self.source_args()),
                                  unserved_hint=self.sources.unserved_hint)

    def source_args(self) -> list[str]:
        """uv's sources: find-links (the profile's, ``--find-links``, the host's wheelhouse
        and, on ``local`` unless the profile opts out, PIP_FIND_LINKS / UV_FIND_LINKS), then
        the index. Find-links stand in for the profile's extra indexes (which serve only the
        builds the lock pins from them, such as torch's ``+cpu`` wheel), so those are asked
        only when no find-links are given; a wheelhouse alone means offline."""
        s = self.sources
        links = list(dict.fromkeys([*s.find_links, *self.find_links,
                                    *([self.host.wheelhouse] if self.host.wheelhouse else [])]))
        if self.transport.is_local and s.env_find_links:
            links += [x for x in local_find_links(self.environ) if x not in links]
        args: list[str] = []
        for fl in links:
            args += ["--find-links", fl]
        index = self.host.index_url or (None if self.host.wheelhouse else s.index_url)
        if index:
            args += ["--index-url", index]
            if not links:
                for extra in s.extra_index_urls:
                    args += ["--extra-index-url", extra]
            if s.index_strategy:
                args += ["--index-strategy", s.index_strategy]
        else:
            args += ["--no-index", "--offline"]
        return args
