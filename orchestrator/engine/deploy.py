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

import logging
import os
import posixpath
import subprocess
from pathlib import Path

from dfo_contract.env_fingerprint import EnvFingerprint


from ..config.profiles import Profile, load_profile
from ..common.errors import DeployError, DfoError
from ..plan import deploy_plan as dp
from ..plan.launch_facts import LaunchFacts
from ..plan.uv import local_find_links, translate_uv_error  # noqa: F401 (re-exported)
from ..plan.uv_progress import human_bytes, parse_du_k
from .deploy_check import DeployChecks
from .deploy_probe import SMALL_TIMEOUT, DeployProbe
from .deploy_run import DeployRunner
from .deploy_switch import EnvSwitch
from .lease import DeployLease
from .stages import DeployReport, EventFn, StageClock, StageResult, finish  # noqa: F401 (re-exported)
from .wheel import ProjectWheel, uv_bin

log = logging.getLogger("dfo")


def local_uv() -> tuple[str, str]:
    """(path, ``uv X.Y.Z ...``) of the uv binary from the local ``uv`` package."""
    path = uv_bin()
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return path, out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


class Deployer:
    """``dfo deploy`` on one host. It builds, once, the parts its steps share and gives each
    held object the ones it uses: ``probe`` (``DeployProbe``: what this dfo deploys, the
    host's envs, verify, mark complete), ``runner`` (``DeployRunner``: commands under the
    lease, uv's sources and errors), the stage ``clock`` and the ``lease``. It holds
    ``envs`` (``EnvSwitch``: the switch of envs/current, half-built envs, free space) and
    ``checks`` (``DeployChecks``: ``--check``, ``--rollback``, launch's check, the dfo-wheel
    switch); ``check``, ``launch_check``, ``switch_dfo_wheel`` and ``rollback`` here are
    that object's."""

    def __init__(self, transport, host, *, profile: Profile | str | None = None,
                 on_event: EventFn | None = None, environ: dict[str, str] | None = None,
                 wheel: ProjectWheel | None = None, find_links: tuple[str, ...] = ()):
        self.transport = transport
        self.host = host
        self.tree = host.tree
        prof = profile if profile is not None else host.profile
        self.profile = prof if isinstance(prof, Profile) else load_profile(prof)
        clock = self.clock = StageClock(on_event)
        self._env_bytes: int | None = None  # measured after an install
        self.lease = DeployLease(transport, self.tree, host.name,
                                 say=lambda msg: clock.emit("connect", "line", None, msg))
        self.probe = DeployProbe(transport, host, self.profile, clock=clock, wheel=wheel)
        self.runner = DeployRunner(
            transport, host, lease=self.lease, sources=self.profile.sources,
            say=lambda stage, line: clock.emit(stage, "line", None, line),
            find_links=find_links, environ=dict(os.environ if environ is None else environ))
        self.envs = EnvSwitch(transport, self.tree, host.name, clock=clock,
                              lease=self.lease, run=self.runner.run,
                              min_free_mb=self.profile.min_free_mb)
        self.checks = DeployChecks(self.probe, self.runner, self.envs, clock=clock,
                                   lease=self.lease)

    # ------------------------------------------------------------------ checks (DeployChecks)
    def check(self) -> DeployReport:
        return self.checks.check()

    def launch_check(self, facts: LaunchFacts) -> tuple[DeployReport, tuple[str, bytes] | None]:
        return self.checks.launch_check(facts)

    def switch_dfo_wheel(self, state: dp.RemoteState) -> str:
        return self.checks.switch_dfo_wheel(state)

    def rollback(self) -> DeployReport:
        return self.checks.rollback()

    # ------------------------------------------------------------------ what launch asks (DeployProbe)
    def local_facts(self):
        """(the profile's lock, its bytes, the env dir it deploys to)."""
        return self.probe.local_facts()

    def wheel(self) -> ProjectWheel:
        return self.probe.wheel()

    def wheel_remote(self) -> str:
        return self.probe.wheel_remote()

    def python_spec(self) -> str:
        return self.probe.python_spec()

    # ------------------------------------------------------------------ remote steps
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
        w = self.probe.wheel()
        t = self.clock.begin("push wheel", w.filename)
        self.transport.put(w.path, remote, mode=0o644)
        self.clock.end("push wheel", t, f"{w.filename} ({w.short})")

    def _install(self, env_dir: str, lock_bytes: bytes, *, sync: bool, reinstall: bool,
                 detail: str) -> None:
        t = self.clock.begin("install", detail)
        py = posixpath.join(env_dir, "bin", "python")
        uv = self.tree.uv
        if sync:
            lock_remote = posixpath.join(env_dir, "requirements.lock")
            self.transport.put(lock_bytes, lock_remote, mode=0o644)
            argv = [uv, "pip", "sync", "--require-hashes", "--python", py, *self.runner.source_args()]
            if reinstall:
                argv.append("--reinstall")
            argv.append(lock_remote)
            self.runner.stream("install", argv, what="installing the lock")
        argv = [uv, "pip", "install", "--no-deps", "--no-index", "--offline", "--python", py,
                "--reinstall-package", "dfo", self.probe.wheel_remote()]
        self.runner.run(argv, timeout=SMALL_TIMEOUT * 3, what="installing the dfo wheel")
        self._env_bytes = self._env_size(env_dir)
        if self._env_bytes is not None:
            detail = f"{detail}; env is {human_bytes(self._env_bytes)}"
        self.clock.end("install", t, detail)

    def _env_size(self, env_dir: str) -> int | None:
        """The env's size on disk (``du -sk``; files hardlinked from the uv cache count
        here once). None when du cannot say."""
        try:
            return parse_du_k(self.runner.run(["du", "-sk", "--", env_dir], what="measuring the env",
                                        locked=False))
        except DfoError:
            return None

    # ------------------------------------------------------------------ commands
    def deploy(self, *, force: bool = False) -> DeployReport:
        self.clock.restart()
        lock, lock_bytes, env_dir = self.probe.local_facts()
        target = posixpath.basename(env_dir)
        uv_path, uv_version = local_uv()
        self.probe.wheel()
        t = self.clock.begin("connect", self.host.describe() if hasattr(self.host, "describe") else "")
        state = self.probe.state(env_dir)
        self.clock.end("connect", t, f"{self.host.name}: current {state.current_name or 'none'}")
        plan = dp.make_plan(state, target=target, lock=lock, expect=self.profile.expect,
                            local_uv=uv_version, wheel_remote=self.probe.wheel_remote(), force=force)
        report = DeployReport(self.host.name, self.profile.name, plan.target, plan.action,
                              drift=plan.drift.lines() if plan.drift else [])
        if plan.noop:
            for s in plan.steps[1:]:
                self.clock.skip(s.stage, s.reason)
            report.message = f"{plan.target} is current and matches its lock: nothing to do"
            if plan.clean and self.envs.clean_alone(state, plan.clean):
                report.message += f"; removed the half-built {', '.join(plan.clean)}"
            return self._finish(report, state.current_fingerprint)

        self.envs.guard_run_lock(state)
        if plan.runs("create venv"):
            if not state.python:
                raise DeployError(
                    f"python {self.probe.python_spec()} not found on {self.host.name} "
                    f"(profile {self.profile.name} needs it)",
                    hint=f"install python{self.probe.python_spec()} there, or set `python:` in "
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
            self._push_wheel(self.probe.wheel_remote())
        else:
            self.clock.skip("push wheel", steps["push wheel"].reason)
        if plan.clean:
            self.envs.clean(plan.clean)
        if plan.runs("install") and not plan.runs("create venv"):
            # re-syncing an env that is not current: not a good env until verified again
            self.runner.run(["rm", "-f", "--", posixpath.join(env_dir, dp.COMPLETE_MARKER)],
                      what="re-syncing the env")
        if steps["create venv"].run:
            t = self.clock.begin("create venv", self.probe.python_spec())
            self.runner.run([self.tree.uv, "venv", "--quiet", "--python", state.python,
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
        fp = self.probe.verify(env_dir, lock.sha256, keep=state.current_name or "none")
        self.probe.mark_complete(env_dir, fp, lock.sha256)
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
        return self._finish(report, fp)

    def _finish(self, report: DeployReport, fp: EnvFingerprint | None) -> DeployReport:
        return finish(report, self.clock, fp, env_bytes=self._env_bytes)
