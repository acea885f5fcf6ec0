"""``dfo deploy --check`` and ``--rollback``: compare envs/current with its lock and
fingerprint, or switch back to envs/previous after verifying it (a mixin of ``Deployer``:
uses its clock, lease, probes and switch)."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from ..config.profiles import Profile
from ..errors import DeployError, NotFoundError, RemoteCommandError
from ..ops import deploy_plan as dp
from ..ops.drift import fingerprint_drift
from ..ops.fingerprint import compare, fingerprint_changes
from .stages import DeployReport


class DeployChecks:
    def check(self) -> DeployReport:
        """Compare envs/current with the lock and its fingerprint (no change made)."""
        self.clock.restart()
        lock, _, env_dir = self._local_facts()
        target = posixpath.basename(env_dir)
        t = self.clock.begin("connect")
        state = self.probe_state(env_dir)
        self.clock.end("connect", t, f"current {state.current_name or 'none'}")
        report = DeployReport(self.host.name, self.profile.name, target, "check")
        lines: list[str] = []
        if not state.current_name:
            lines.append(f"no env deployed (envs/current missing; the lock wants {target})")
        else:
            if state.current_name != target:
                lines.append(f"envs/current is {state.current_name}, the lock wants {target}")
            if not state.current_marker:
                lines.append(f"{state.current_name} is incomplete (a deploy was cut short)")
            elif state.current_marker.get("lock_hash") != lock.sha256 and \
                    state.current_name == target:
                lines.append(f"{state.current_name} was built from another lock")
            if state.current_freeze is None:
                lines.append(f"{state.current_name}: cannot list its packages (no python or uv)")
            else:
                lines += dp.current_drift(state, lock, self.wheel_remote()).lines()
            recorded = state.current_fingerprint
            if not recorded:
                lines.append(f"{state.current_name} has no fingerprint.json")
            else:
                tv = self.clock.begin("verify", "probe envs/current")
                try:
                    probe = self._probe(self.layout.current_env)
                except DeployError as e:
                    lines.append(f"probe failed: {e}")
                else:
                    lines += [str(i) for i in fingerprint_drift(fingerprint_changes(recorded, probe))]
                    lines += [str(m) for m in compare(probe, self.profile.expect)]
                self.clock.end("verify", tv, "probe of envs/current")
                report.fingerprint = recorded
        seen: set[str] = set()
        report.drift = [x for x in lines if not (x in seen or seen.add(x))]
        report.ok = not report.drift
        report.message = ("envs/current matches its lock and fingerprint" if report.ok else
                          f"{len(report.drift)} difference(s) from the lock")
        return self._finish(report, report.fingerprint)

    def rollback(self) -> DeployReport:
        """Switch envs/current back to envs/previous, after verifying it."""
        self.clock.restart()
        t = self.clock.begin("connect")
        state = self.probe_state(posixpath.join(self.layout.envs, "-"), "-")
        self.clock.end("connect", t, f"current {state.current_name or 'none'}, "
                                f"previous {state.previous_name or 'none'}")
        plan = dp.rollback_plan(state)
        self._guard_run_lock(state)
        prev_dir = posixpath.join(self.layout.envs, plan.target)
        report = DeployReport(self.host.name, "?", plan.target, "rollback")
        self.lease.acquire(state)
        try:
            try:
                recorded = json.loads(self.t.get(posixpath.join(prev_dir, dp.FINGERPRINT_FILE)))
                if not isinstance(recorded, dict):
                    raise ValueError("not a JSON object")
            except (NotFoundError, RemoteCommandError, ValueError) as e:
                raise DeployError(f"the previous env {plan.target} has no readable fingerprint: {e}",
                                  hint="deploy again to build a good env") from None
            report.profile = str(recorded.get("profile") or "?")
            for s in ("push uv", "push wheel", "create venv", "install"):
                self.clock.skip(s, "not needed")
            prof = Profile(name=report.profile, directory=Path("."), python="", lock_file=Path("."),
                           lock_sha256=None, sources=self.profile.sources, expect={})
            fp = self._verify(prev_dir, str(recorded.get("lock_hash") or ""), profile=prof,
                              recorded=recorded, keep=state.current_name or "none")
            fp = recorded  # unchanged: the probe matched what was recorded
            self._switch(plan.target, plan.new_previous)
        finally:
            self.lease.release()
        report.message = f"rolled back: envs/current -> {plan.target} (previous: {plan.new_previous})"
        return self._finish(report, fp)
