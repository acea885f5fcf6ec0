"""``dfo deploy --check`` and ``--rollback``: compare envs/current with its lock and
fingerprint, or switch back to envs/previous after verifying it; launch's check and its
switch to this dfo's wheel. ``DeployChecks`` is held by ``Deployer`` and given the parts it
builds: the host's ``DeployProbe`` (``deploy_probe``), its ``DeployRunner`` (``deploy_run``),
its ``EnvSwitch`` (``deploy_switch``), the stage clock and the lease."""

from __future__ import annotations

import datetime as _dt
import logging
import posixpath
from pathlib import Path
from typing import Callable

from dfo_contract.env_fingerprint import EnvFingerprint


from ..config.profiles import Profile
from ..common.errors import DeployError, RemoteCommandError
from ..plan import deploy_plan as dp
from ..plan.drift import fingerprint_drift
from ..plan.fingerprint import EXPECT_FIELDS, compare, fingerprint_changes, parse_probe
from ..plan.launch_facts import VERIFIED_FILE, LaunchFacts, record_bytes
from ..config.host_tree import env_generation
from .deploy_probe import DeployProbe
from .deploy_run import DeployRunner
from .deploy_switch import EnvSwitch
from .lease import DeployLease
from .stages import DeployReport, StageClock, finish

log = logging.getLogger("dfo")


def _shown(state: dp.RemoteState, target: str) -> str:
    """The env a check names: envs/current when it is a generation of the lock's env."""
    cur = state.current_name
    return cur if cur and env_generation(cur)[0] == target else target


class DeployChecks:
    """The checks of one host's envs: ``probe`` (what this dfo deploys, the host's envs),
    ``runner`` (commands under the lease), ``envs`` (the switch), the stage ``clock`` and
    the deploy ``lease``."""

    def __init__(self, probe: DeployProbe, runner: DeployRunner, envs: EnvSwitch, *,
                 clock: StageClock, lease: DeployLease):
        self.probe = probe
        self.runner = runner
        self.envs = envs
        self.clock = clock
        self.lease = lease
        self.tree = probe.tree

    def check(self) -> DeployReport:
        """Compare envs/current with the lock and its fingerprint (no change made)."""
        self.clock.restart()
        lock, _, env_dir = self.probe.local_facts()
        target = posixpath.basename(env_dir)
        t = self.clock.begin("connect")
        state = self.probe.state(env_dir)
        self.clock.end("connect", t, f"current {state.current_name or 'none'}")
        report = DeployReport(self.probe.host.name, self.probe.profile.name,
                              _shown(state, target), "check")
        lines = self._drift_lines(state, lock, target,
                                  lambda: self._timed_probe(self.tree.current_env))
        report.fingerprint = state.current_fingerprint or None
        report.drift = list(dict.fromkeys(lines))  # each line once, in order
        report.ok = not report.drift
        report.dfo_only = self._dfo_only(state, lock, report.drift)
        report.message = ("envs/current matches its lock and fingerprint" if report.ok else
                          f"{len(report.drift)} difference(s) from the lock")
        return finish(report, self.clock, report.fingerprint)

    def _timed_probe(self, env_dir: str) -> EnvFingerprint:
        tv = self.clock.begin("verify", "probe envs/current")
        try:
            return self.probe.env(env_dir)
        finally:
            self.clock.end("verify", tv, "probe of envs/current")

    def _drift_lines(self, state: dp.RemoteState, lock, target: str,
                     probe: Callable[[], EnvFingerprint]) -> list[str]:
        """Every way envs/current differs from its lock, marker, fingerprint and the
        profile's ``expect:`` (``probe`` gives the env probe's answer: run now, or recorded)."""
        lines: list[str] = []
        if not state.current_name:
            return [f"no env deployed (envs/current missing; the lock wants {target})"]
        ours = env_generation(state.current_name)[0] == target  # any generation of it
        if not ours:
            lines.append(f"envs/current is {state.current_name}, the lock wants {target}")
        if state.current_marker is None:
            lines.append(f"{state.current_name} is incomplete (a deploy was cut short)")
        elif state.current_marker.lock_hash != lock.sha256 and ours:
            lines.append(f"{state.current_name} was built from another lock")
        if state.current_freeze is None:
            lines.append(f"{state.current_name}: cannot list its packages (no python or uv)")
        else:
            lines += dp.current_drift(state, lock, self.probe.wheel_remote()).lines()
        recorded = state.current_fingerprint
        if recorded is None:
            lines.append(f"{state.current_name} has no fingerprint.json")
        else:
            try:
                now = probe()
            except DeployError as e:
                lines.append(f"probe failed: {e}")
            else:
                lines += [str(i) for i in fingerprint_drift(fingerprint_changes(recorded, now))]
                lines += [str(m) for m in compare(now, self.probe.profile.expect)]
        return lines

    def launch_check(self, facts: LaunchFacts) -> tuple[DeployReport, tuple[str, bytes] | None]:
        """``check`` for ``dfo launch``, from the facts of its one round trip: the env probe's
        answer is the recorded one while the env's verification holds, else the one the same
        round trip ran (its stamp changed, or a file under its site-packages did). Returns
        the report and, when a fresh probe passed, the record to write for the next launch
        (path, bytes): launch writes it with the run's files; a dry run writes nothing."""
        self.clock.restart()
        lock, _, env_dir = self.probe.local_facts()
        target = posixpath.basename(env_dir)
        state = facts.state
        if state is None or not state.complete_output:
            raise RemoteCommandError(f"the state probe on {self.probe.host.name} did not finish",
                                     hint="the target needs bash and coreutils")
        rec = facts.verified
        if rec is not None:
            state.current_freeze = rec.freeze
        report = DeployReport(self.probe.host.name, self.probe.profile.name,
                              _shown(state, target), "check")
        probed: list[EnvFingerprint] = []

        def probe() -> EnvFingerprint:
            if rec is not None:
                return rec.probe
            probed.append(parse_probe((facts.probe_text or "") + "\n"))
            return probed[-1]

        lines = self._drift_lines(state, lock, target, probe)
        report.drift = list(dict.fromkeys(lines))  # each line once, in order
        report.ok = not report.drift
        report.dfo_only = self._dfo_only(state, lock, report.drift)
        report.cached = rec is not None
        report.fingerprint = state.current_fingerprint or None
        record = None
        if report.ok and probed and facts.stamp and state.current_freeze is not None:
            record = self._verified_record(facts, probed[-1], state.current_freeze)
        report.message = ("envs/current matches its lock and fingerprint"
                          + (" (recorded verification)" if report.cached else "")
                          if report.ok else f"{len(report.drift)} difference(s) from the lock")
        return finish(report, self.clock, report.fingerprint), record

    def _dfo_only(self, state: dp.RemoteState, lock, drift: list[str]) -> str | None:
        """When the only difference is dfo's own wheel (another dfo deployed its wheel into
        envs/current): what is installed instead; else None."""
        proj = [i for i in dp.current_drift(state, lock, self.probe.wheel_remote()).items
                if i.kind == "project"]
        own = {str(i) for i in proj}
        version_line = EXPECT_FIELDS["dfo"] + ":"
        if not proj or any(x not in own and not x.startswith(version_line) for x in drift):
            return None
        got = proj[0].installed or "nothing"
        return posixpath.basename(got.rstrip("/")) if "/" in got else got

    def switch_dfo_wheel(self, state: dp.RemoteState) -> str:
        """Install this dfo's wheel into envs/current when it is already on the host (an
        earlier deploy from this dfo left it under wheels/<hash>/) and only dfo's own wheel
        differs: the lock's packages stay as they are. Verified and re-marked like a deploy;
        refused while a run holds run.lock (its next attempt would load another dfo)."""
        lock, _, _ = self.probe.local_facts()
        self.envs.guard_run_lock(state)
        env_dir = posixpath.join(self.tree.envs, state.current_name)
        py = posixpath.join(env_dir, "bin", "python")
        self.lease.acquire(state)
        try:
            self.runner.run(["rm", "-f", "--", posixpath.join(env_dir, dp.COMPLETE_MARKER),
                               posixpath.join(env_dir, VERIFIED_FILE)],
                              what="switching the dfo wheel")
            self.runner.run([self.tree.uv, "pip", "install", "--no-deps",
                               "--no-index", "--offline", "--python", py,
                               "--reinstall-package", "dfo", self.probe.wheel_remote()],
                              timeout=300, what="switching the dfo wheel")
            fp = self.probe.verify(env_dir, lock.sha256, keep=state.current_name)
            self.probe.mark_complete(env_dir, fp, lock.sha256)
        finally:
            self.lease.release()
        return posixpath.basename(self.probe.wheel_remote())

    def _verified_record(self, facts: LaunchFacts, probe: EnvFingerprint,
                         freeze: str) -> tuple[str, bytes] | None:
        when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        try:
            data = record_bytes(facts.stamp, facts.at, probe, freeze, when)
        except ValueError as e:   # not recorded: the next launch probes
            log.debug("no verification record: %s", e)
            return None
        return posixpath.join(self.tree.current_env, VERIFIED_FILE), data

    def rollback(self) -> DeployReport:
        """Switch envs/current back to envs/previous, after verifying it."""
        self.clock.restart()
        t = self.clock.begin("connect")
        state = self.probe.state(posixpath.join(self.tree.envs, "-"), "-")
        self.clock.end("connect", t, f"current {state.current_name or 'none'}, "
                       f"previous {state.previous_name or 'none'}")
        plan = dp.rollback_plan(state)
        self.envs.guard_run_lock(state)
        prev_dir = posixpath.join(self.tree.envs, plan.target)
        report = DeployReport(self.probe.host.name, "?", plan.target, "rollback")
        self.lease.acquire(state)
        try:
            recorded = self.probe.recorded_fingerprint(prev_dir)
            report.profile = recorded.profile or "?"
            for s in ("push uv", "push wheel", "create venv", "install"):
                self.clock.skip(s, "not needed")
            prof = Profile(name=report.profile, directory=Path("."), python="", lock_file=Path("."),
                           lock_sha256=None, sources=self.probe.profile.sources, expect={})
            fp = self.probe.verify(prev_dir, recorded.lock_hash,
                                   profile=prof, recorded=recorded,
                                   keep=state.current_name or "none")
            fp = recorded  # unchanged: the probe matched what was recorded
            self.envs.switch(plan.target, plan.new_previous)
        finally:
            self.lease.release()
        report.message = f"rolled back: envs/current -> {plan.target} (previous: {plan.new_previous})"
        return finish(report, self.clock, fp)
