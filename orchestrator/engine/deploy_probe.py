"""What a deploy knows of one host's envs (``DeployProbe``): what this dfo deploys there
(the profile's lock and the env directory it names, dfo's wheel and its place on the host,
the python spec), what the host has (the state probe, the env probe), an env's verification
against the profile, and the records that make an env good (``fingerprint.json``,
``.dfo-complete``). ``Deployer`` (``deploy``) builds it once and gives it to its
``DeployChecks`` (``deploy_check``); verification reports through the deploy's stage clock."""

from __future__ import annotations

import datetime as _dt
import json
import posixpath

from dfo_contract.env_fingerprint import EnvComplete, EnvFingerprint


from .. import __version__
from ..config.profiles import Profile
from ..common.errors import DeployError, NotFoundError, RemoteCommandError, VerifyError
from ..plan import deploy_plan as dp
from ..plan.fingerprint import (Mismatch, build_fingerprint, compare, fingerprint_changes,
                                fingerprint_json, parse_fingerprint, parse_probe, probe_argv)
from .stages import StageClock
from .wheel import ProjectWheel, build as build_wheel

PROBE_TIMEOUT = 600.0
SMALL_TIMEOUT = 120.0


class DeployProbe:
    """The envs of ``host`` (its name, tree and python) through ``transport``, for
    ``profile``; ``wheel``: dfo's wheel when already built (else built on first use)."""

    def __init__(self, transport, host, profile: Profile, *, clock: StageClock,
                 wheel: ProjectWheel | None = None):
        self.transport = transport
        self.host = host
        self.tree = host.tree
        self.profile = profile
        self.clock = clock
        self._wheel = wheel

    # ------------------------------------------------------------------ what this dfo deploys
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

    # ------------------------------------------------------------------ what the host has
    def state(self, env_dir: str, wheel_remote: str | None = None) -> dp.RemoteState:
        """The state probe: envs/current and previous, the env ``env_dir``, locks, space."""
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

    def env(self, env_dir: str) -> EnvFingerprint:
        """The env probe's answer: what ``env_dir``'s python imports (versions, devices)."""
        py = posixpath.join(env_dir, "bin", "python")
        r = self.transport.run(probe_argv(py), timeout=PROBE_TIMEOUT,
                               env={"PYTHONDONTWRITEBYTECODE": "1", "CUDA_MODULE_LOADING": "LAZY"})
        return parse_probe(r.out + "\n" + r.err)

    def recorded_fingerprint(self, env_dir: str) -> EnvFingerprint:
        """``env_dir``'s fingerprint.json, for a rollback to it (DeployError when it has
        none readable)."""
        name = posixpath.basename(env_dir)
        try:
            return parse_fingerprint(self.transport.get(posixpath.join(env_dir, dp.FINGERPRINT_FILE)))
        except (NotFoundError, RemoteCommandError, ValueError) as e:
            raise DeployError(f"the previous env {name} has no readable fingerprint: {e}",
                              hint="deploy again to build a good env") from None

    # ------------------------------------------------------------------ judging and recording
    def verify(self, env_dir: str, lock_sha: str, *, profile: Profile | None = None,
               recorded: EnvFingerprint | None = None, keep: str = "") -> EnvFingerprint:
        """Probe ``env_dir`` and compare it with the profile's ``expect:`` and dfo's wheel
        (or with ``recorded``, its fingerprint); its fingerprint, or VerifyError."""
        prof = profile or self.profile
        t = self.clock.begin("verify", posixpath.basename(env_dir))
        probe = self.env(env_dir)
        mism: list[Mismatch] = compare(probe, prof.expect)
        if recorded is None and probe.dfo != self.wheel().version:
            mism.append(Mismatch("dfo", self.wheel().version, probe.dfo))
        if recorded is not None:
            mism += fingerprint_changes(recorded, probe)
        if mism:
            self.clock.end("verify", t, "; ".join(map(str, mism)), status="failed")
            kept = f"envs/current is unchanged ({keep})" if keep else "envs/current is unchanged"
            raise VerifyError(f"verification of {posixpath.basename(env_dir)} on "
                              f"{self.host.name} failed: " + "; ".join(map(str, mism)),
                              hint=kept)
        fp = build_fingerprint(probe, profile=prof.name, lock_hash=lock_sha)
        self.clock.end("verify", t, f"torch {fp.torch}, transformers {fp.transformers}")
        return fp

    def mark_complete(self, env_dir: str, fp: EnvFingerprint, lock_sha: str) -> None:
        """Write ``env_dir``'s fingerprint.json, then ``.dfo-complete`` (last: a good env)."""
        w = self.wheel()
        self.transport.put(fingerprint_json(fp), posixpath.join(env_dir, dp.FINGERPRINT_FILE),
                           mode=0o644)
        marker = EnvComplete(profile=self.profile.name, lock_hash=lock_sha, dfo=__version__,
                             wheel=self.wheel_remote(), wheel_sha256=w.sha256,
                             source_digest=w.digest,
                             created=_dt.datetime.now(_dt.timezone.utc).isoformat(
                                 timespec="seconds"))
        self.transport.put(json.dumps(marker.to_json()).encode() + b"\n",
                           posixpath.join(env_dir, dp.COMPLETE_MARKER), mode=0o644)
