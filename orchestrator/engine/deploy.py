"""Carry out ``dfo deploy``'s plan through one Transport (one SSH connection).

Stages: connect, push uv, push wheel, create venv, install, verify, switch. Each
is timed and reported through ``on_event(stage, status, seconds, detail)`` (status:
``start``, ``line``, ``done``, ``skip``, ``fail``). Decisions come from
``orchestrator.plan.deploy_plan`` (pure); this module only runs them.

Guarantees:
- nothing that fails verification becomes ``envs/current``, and the env it points to is
  never changed in place: a repair, an update or ``--force`` builds the next generation
  beside it and switches to it, so a deploy that fails or is cut short leaves it as it was;
- an env is good only with ``.dfo-complete`` (written last); half-built ones are removed
  by the next deploy;
- mutating commands hold ``flock`` on ``locks/deploy.lock`` under this deploy's lease;
  the switch holds ``flock -n locks/run.lock`` so it never happens under a live run.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import posixpath
import subprocess
from pathlib import Path
from typing import Any

from .. import __version__
from ..config.profiles import Profile, load_profile
from ..common.errors import DeployError, DfoError, LockHeldError, RemoteCommandError, VerifyError
from ..plan import deploy_plan as dp
from ..plan.fingerprint import (Mismatch, build_fingerprint, compare, fingerprint_changes,
                              fingerprint_json, parse_probe, probe_argv)
from ..plan.launch_facts import LaunchFacts
from ..plan.uv import describe_sources, local_find_links, translate_uv_error
from ..plan.uv_progress import UvProgress, human_bytes, parse_du_k
from .deploy_check import DeployChecks
from .deploy_switch import EnvSwitch
from .lease import DeployLease
from .stages import DeployReport, EventFn, StageClock, StageResult  # noqa: F401 (re-exported)
from .wheel import ProjectWheel, build as build_wheel, uv_bin

log = logging.getLogger("dfo")

PROBE_TIMEOUT = 600.0
SMALL_TIMEOUT = 120.0


def local_uv() -> tuple[str, str]:
    """(path, ``uv X.Y.Z ...``) of the uv binary from the local ``uv`` package."""
    path = uv_bin()
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return path, out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


class Deployer:
    """``dfo deploy`` on one host. It holds ``envs`` (``EnvSwitch``: the switch of
    envs/current, half-built envs, free space) and ``checks`` (``DeployChecks``: ``--check``,
    ``--rollback``, launch's check, the dfo-wheel switch); ``check``, ``launch_check``,
    ``switch_dfo_wheel`` and ``rollback`` here are that object's."""

    def __init__(self, transport, host, *, profile: Profile | str | None = None,
                 on_event: EventFn | None = None, environ: dict[str, str] | None = None,
                 wheel: ProjectWheel | None = None, find_links: tuple[str, ...] = ()):
        self.transport = transport
        self.find_links = tuple(find_links)  # `dfo deploy --find-links`: dirs or URLs uv reads
        self.host = host
        self.tree = host.tree
        prof = profile if profile is not None else host.profile
        self.profile = prof if isinstance(prof, Profile) else load_profile(prof)
        self.environ = dict(os.environ if environ is None else environ)
        self._wheel = wheel
        self.clock = StageClock(on_event)
        self.env_bytes: int | None = None  # measured after an install
        self.lease = DeployLease(transport, self.tree, host.name,
                                 say=lambda msg: self.clock.emit("connect", "line", None, msg))
        self.envs = EnvSwitch(transport, self.tree, host.name, clock=self.clock,
                              lease=self.lease, run=self.run,
                              min_free_mb=self.profile.min_free_mb)
        self.checks = DeployChecks(self, self.envs)

    # ------------------------------------------------------------------ checks (DeployChecks)
    def check(self) -> DeployReport:
        return self.checks.check()

    def launch_check(self, facts: LaunchFacts) -> tuple[DeployReport, tuple[str, bytes] | None]:
        return self.checks.launch_check(facts)

    def switch_dfo_wheel(self, state: dp.RemoteState) -> str:
        return self.checks.switch_dfo_wheel(state)

    def rollback(self) -> DeployReport:
        return self.checks.rollback()

    # ------------------------------------------------------------------ helpers
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

    def _stream(self, stage: str, argv: list[str], *, what: str) -> None:
        argv = self.lease.locked(argv)
        tail: list[str] = []
        progress = UvProgress()

        def on_line(line: str) -> None:
            tail.append(line)
            del tail[:-40]
            log.debug("%s: %s", stage, line)
            summary = progress.feed(line)
            if summary or line.strip():
                self.clock.emit(stage, "line", None, (summary or line.strip())[:160])

        r = self.transport.stream(argv, on_line, env=self._env(), timeout=None)
        if r.exit_code != 0:
            text = "\n".join(tail)
            if r.exit_code == dp.EXIT_BUSY and "deploy" in text:
                raise LockHeldError(f"lost the deploy lock on {self.host.name} while {what}",
                                    hint="another deploy took over; run dfo deploy again")
            raise self._uv_error(text, what)

    def _uv_error(self, text: str, what: str):
        return translate_uv_error(text, host=self.host.name, root=self.tree.root, what=what,
                                  sources=describe_sources(self._source_args()),
                                  unserved_hint=self.profile.sources.unserved_hint)

    # ------------------------------------------------------------------ local facts
    def local_facts(self):
        """(the profile's lock, its bytes, the env dir it deploys to)."""
        lock, lock_bytes = self.profile.load_lock()
        env_dir = self.tree.env_dir(self.profile.name, lock.sha256)
        return lock, lock_bytes, env_dir

    def wheel(self) -> ProjectWheel:
        if self._wheel is None:
            self._wheel = build_wheel()
        return self._wheel

    def wheel_remote(self) -> str:
        w = self.wheel()
        return posixpath.join(self.tree.wheels, w.short, w.filename)

    def python_spec(self) -> str:
        return self.host.python or self.profile.python

    # ------------------------------------------------------------------ remote steps
    def probe_state(self, env_dir: str, wheel_remote: str | None = None) -> dp.RemoteState:
        argv = dp.script_argv(dp.STATE_SCRIPT, self.tree.root, env_dir, self.python_spec(),
                              wheel_remote or self.wheel_remote(), name="dfo-state")
        r = self.transport.run(argv, timeout=SMALL_TIMEOUT)
        state = dp.parse_state(r.out)
        if not state.complete_output:
            raise RemoteCommandError(
                f"the state probe on {self.host.name} failed (exit {r.exit_code}): "
                f"{(r.err.strip().splitlines() or ['no output'])[-1]}",
                hint="the target needs bash and coreutils")
        if state.arch and state.arch != "x86_64":
            raise DeployError(f"{self.host.name} is {state.arch}; the profile locks are for x86_64",
                              hint="make a profile for that platform (docs/deploy.md)")
        return state

    def _push_uv(self, path: str, version: str) -> None:
        t = self.clock.begin("push uv", version)
        self.transport.put(Path(path), self.tree.uv, mode=0o755)
        out = self.transport.run([self.tree.uv, "--version"], timeout=60)
        if not dp.uv_matches(out.out.strip(), version):
            raise DeployError(f"uv pushed to {self.tree.uv} on {self.host.name} does not run: "
                              f"{(out.err or out.out).strip()[:200]}",
                              hint="the target must be linux x86_64 with glibc")
        self.clock.end("push uv", t, version)

    def _push_wheel(self, remote: str) -> None:
        w = self.wheel()
        t = self.clock.begin("push wheel", w.filename)
        self.transport.put(w.path, remote, mode=0o644)
        self.clock.end("push wheel", t, f"{w.filename} ({w.short})")

    def _source_args(self) -> list[str]:
        """uv's sources: find-links (the profile's, ``--find-links``, the host's wheelhouse
        and, on ``local`` unless the profile opts out, PIP_FIND_LINKS / UV_FIND_LINKS), then
        the index. Find-links stand in for the profile's extra indexes (which serve only the
        builds the lock pins from them, such as torch's ``+cpu`` wheel), so those are asked
        only when no find-links are given; a wheelhouse alone means offline."""
        s = self.profile.sources
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

    def _install(self, env_dir: str, lock_bytes: bytes, *, sync: bool, reinstall: bool,
                 detail: str) -> None:
        t = self.clock.begin("install", detail)
        py = posixpath.join(env_dir, "bin", "python")
        uv = self.tree.uv
        if sync:
            lock_remote = posixpath.join(env_dir, "requirements.lock")
            self.transport.put(lock_bytes, lock_remote, mode=0o644)
            argv = [uv, "pip", "sync", "--require-hashes", "--python", py, *self._source_args()]
            if reinstall:
                argv.append("--reinstall")
            argv.append(lock_remote)
            self._stream("install", argv, what="installing the lock")
        argv = [uv, "pip", "install", "--no-deps", "--no-index", "--offline", "--python", py,
                "--reinstall-package", "dfo", self.wheel_remote()]
        self.run(argv, timeout=SMALL_TIMEOUT * 3, what="installing the dfo wheel")
        self.env_bytes = self._env_size(env_dir)
        if self.env_bytes is not None:
            detail = f"{detail}; env is {human_bytes(self.env_bytes)}"
        self.clock.end("install", t, detail)

    def _env_size(self, env_dir: str) -> int | None:
        """The env's size on disk (``du -sk``; files hardlinked from the uv cache count
        here once). None when du cannot say."""
        try:
            return parse_du_k(self.run(["du", "-sk", "--", env_dir], what="measuring the env",
                                        locked=False))
        except DfoError:
            return None

    def probe_env(self, env_dir: str) -> dict[str, Any]:
        py = posixpath.join(env_dir, "bin", "python")
        r = self.transport.run(probe_argv(py), timeout=PROBE_TIMEOUT,
                       env={"PYTHONDONTWRITEBYTECODE": "1", "CUDA_MODULE_LOADING": "LAZY"})
        return parse_probe(r.out + "\n" + r.err)

    def verify(self, env_dir: str, lock_sha: str, *, profile: Profile | None = None,
                recorded: dict[str, Any] | None = None, keep: str = "") -> dict[str, Any]:
        prof = profile or self.profile
        t = self.clock.begin("verify", posixpath.basename(env_dir))
        probe = self.probe_env(env_dir)
        mism: list[Mismatch] = compare(probe, prof.expect)
        if recorded is None and probe.get("dfo") != self.wheel().version:
            mism.append(Mismatch("dfo", self.wheel().version, probe.get("dfo")))
        if recorded is not None:
            mism += fingerprint_changes(recorded, probe)
        if mism:
            self.clock.end("verify", t, "; ".join(map(str, mism)), status="failed")
            kept = f"envs/current is unchanged ({keep})" if keep else "envs/current is unchanged"
            raise VerifyError(f"verification of {posixpath.basename(env_dir)} on "
                              f"{self.host.name} failed: " + "; ".join(map(str, mism)),
                              hint=kept)
        fp = build_fingerprint(probe, profile=prof.name, lock_hash=lock_sha)
        self.clock.end("verify", t, f"torch {fp.get('torch')}, transformers {fp.get('transformers')}")
        return fp

    def mark_complete(self, env_dir: str, fp: dict[str, Any], lock_sha: str) -> None:
        w = self.wheel()
        self.transport.put(fingerprint_json(fp), posixpath.join(env_dir, dp.FINGERPRINT_FILE), mode=0o644)
        marker = {"profile": self.profile.name, "lock_hash": lock_sha, "dfo": __version__,
                  "wheel": self.wheel_remote(), "wheel_sha256": w.sha256,
                  "source_digest": w.digest,
                  "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        self.transport.put(json.dumps(marker).encode() + b"\n",
                   posixpath.join(env_dir, dp.COMPLETE_MARKER), mode=0o644)

    # ------------------------------------------------------------------ commands
    def deploy(self, *, force: bool = False) -> DeployReport:
        self.clock.restart()
        lock, lock_bytes, env_dir = self.local_facts()
        target = posixpath.basename(env_dir)
        uv_path, uv_version = local_uv()
        self.wheel()
        t = self.clock.begin("connect", self.host.describe() if hasattr(self.host, "describe") else "")
        state = self.probe_state(env_dir)
        self.clock.end("connect", t, f"{self.host.name}: current {state.current_name or 'none'}")
        plan = dp.make_plan(state, target=target, lock=lock, expect=self.profile.expect,
                            local_uv=uv_version, wheel_remote=self.wheel_remote(), force=force)
        report = DeployReport(self.host.name, self.profile.name, plan.target, plan.action,
                              drift=plan.drift.lines() if plan.drift else [])
        if plan.noop:
            for s in plan.steps[1:]:
                self.clock.skip(s.stage, s.reason)
            report.message = f"{plan.target} is current and matches its lock: nothing to do"
            if plan.clean and self.envs.clean_alone(state, plan.clean):
                report.message += f"; removed the half-built {', '.join(plan.clean)}"
            return self.finish(report, state.current_fingerprint)

        self.envs.guard_run_lock(state)
        if plan.runs("create venv"):
            if not state.python:
                raise DeployError(
                    f"python {self.python_spec()} not found on {self.host.name} "
                    f"(profile {self.profile.name} needs it)",
                    hint=f"install python{self.python_spec()} there, or set `python:` in "
                         f"hosts.yaml to an interpreter path; envs/current is untouched")
            self.envs.check_space(state, plan.clean)
        self.lease.acquire(state)
        try:
            return self._execute(plan, state, lock, lock_bytes, uv_path, uv_version, report)
        finally:
            self.lease.release()

    def _execute(self, plan: dp.Plan, state, lock, lock_bytes, uv_path, uv_version,
                 report: DeployReport) -> DeployReport:
        """Build (or re-sync) ``plan.target`` beside envs/current, verify, mark complete, switch:
        envs/current changes only at the switch (a reverify rewrites its fingerprint once
        the probe passed), so a failure before it leaves envs/current as it was."""
        target = plan.target
        env_dir = posixpath.join(self.tree.envs, target)
        steps = {s.stage: s for s in plan.steps}
        if steps["push uv"].run:
            self._push_uv(uv_path, uv_version)
        else:
            self.clock.skip("push uv", steps["push uv"].reason)
        if steps["push wheel"].run:
            self._push_wheel(self.wheel_remote())
        else:
            self.clock.skip("push wheel", steps["push wheel"].reason)
        if plan.clean:
            self.envs.clean(plan.clean)
        if plan.runs("install") and not plan.runs("create venv"):
            # re-syncing an env that is not current: not a good env until verified again
            self.run(["rm", "-f", "--", posixpath.join(env_dir, dp.COMPLETE_MARKER)],
                      what="re-syncing the env")
        if steps["create venv"].run:
            t = self.clock.begin("create venv", self.python_spec())
            self.run([self.tree.uv, "venv", "--quiet", "--python", state.python,
                       "--no-project", env_dir], what="creating the venv", timeout=300)
            self.clock.end("create venv", t, f"{target} from {state.python}")
        else:
            self.clock.skip("create venv", steps["create venv"].reason)
        if steps["install"].run:
            # a venv made just now holds nothing to reinstall: a plain sync fills it from uv's
            # cache (hardlinks), where --reinstall would imply --refresh and fetch it all again
            self._install(env_dir, lock_bytes, sync=plan.sync,
                          reinstall=plan.reinstall and not steps["create venv"].run,
                          detail=steps["install"].reason)
        else:
            self.clock.skip("install", steps["install"].reason)
        fp = self.verify(env_dir, lock.sha256, keep=state.current_name or "none")
        self.mark_complete(env_dir, fp, lock.sha256)
        if steps["switch"].run:
            self.envs.switch(target, plan.new_previous, plan.retire)
        else:
            self.clock.skip("switch", steps["switch"].reason)
        report.message = {
            "create": f"built {target} and made it current",
            "reuse": f"re-verified {target} and made it current",
            "repair": f"repaired: built {target} to its lock and made it current "
                      f"(previous: {plan.new_previous})",
            "update": f"updated dfo: built {target} and made it current "
                      f"(previous: {plan.new_previous})",
            "reverify": f"re-verified {target}",
        }.get(plan.action, plan.action)
        return self.finish(report, fp)

    def finish(self, report: DeployReport, fp: dict[str, Any] | None) -> DeployReport:
        report.fingerprint = fp
        report.env_bytes = self.env_bytes
        report.stages = self.clock.results(dp.STAGES)
        report.total_seconds = self.clock.elapsed()
        return report
