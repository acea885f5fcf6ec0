"""``dfo deploy``'s decisions (pure): the remote state probe, its parser, and the plan.

The deploy talks to the target through a handful of constant shell scripts (package data,
``orchestrator/plan/scripts/deploy_*.sh``, checked by shellcheck) that take every value as a
positional parameter (``"$1"``...), never through f-string shells:

- ``STATE_SCRIPT``: one command that reports everything the plan needs (uv version,
  envs/current and previous, the target env's completeness, the current env's marker,
  fingerprint and ``uv pip freeze``, the interpreter, free disk, run.lock and the deploy
  lease). A no-op redeploy is this one command.
- ``LEASE_SCRIPT`` / ``LOCKED_SCRIPT`` / ``RELEASE_SCRIPT``: the deploy lock. ``flock`` on
  ``locks/deploy.lock`` guards every mutating command; a lease file
  (``locks/deploy.owner``: ``TOKEN INFO``) ties the commands of one deploy together, kept
  fresh by a heartbeat while a command runs, so a second deploy is refused with the
  first one's name, and a killed deploy's lease goes stale.
- ``SWITCH_SCRIPT``: atomic switch of ``envs/current`` (a symlink made under a temporary
  name, then ``mv -T``), under ``flock -n locks/run.lock`` so no run can start meanwhile.

An env is complete when ``<env>/.dfo-complete`` exists; it is written last, after the
probe passed and ``fingerprint.json`` was written. A directory without it (a deploy cut
short by a dropped SSH link, Ctrl-C or kill -9) is never taken for a good env: the
next deploy removes it and builds again. The env envs/current points to is never changed
in place: a repair or update builds the next generation (``<profile>-<lockhash12>.N``,
``host_tree.env_generation``) beside it and switches to it.
"""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from dfo_contract.env_fingerprint import EnvComplete, EnvFingerprint
from dfo_contract.errors import ContractError
from dfo_contract.replies import LeaseHolder, RunLockOwner

from ..common.errors import LockHeldError
from .drift import Drift, Installed, diff, parse_freeze
from .fingerprint import Mismatch, compare, parse_fingerprint
from ..config.host_tree import env_generation, generation_name
from ..config.lockfile import Lock
from .probes import Output, Probe, text
from .scripts import script_text

COMPLETE_MARKER = ".dfo-complete"
FINGERPRINT_FILE = "fingerprint.json"
LEASE_STALE_S = 20  # a lease not refreshed for this long belongs to a dead deploy
HEARTBEAT_S = 3
EXIT_BUSY = 75

STAGES = ("connect", "push uv", "push wheel", "create venv", "install", "verify", "switch")

#: The deploy's shell scripts (package data in ``plan/scripts/``, checked by shellcheck).
STATE_SCRIPT = script_text("deploy_state.sh")
LEASE_SCRIPT = script_text("deploy_lease.sh")
LOCKED_SCRIPT = script_text("deploy_locked.sh")
RELEASE_SCRIPT = script_text("deploy_release.sh")
#: "$1" envs dir, "$2" new current (a dir name in envs/), "$3" new previous ("" keeps it),
#: "$4" run.lock path. Refuses (exit 75, owner on stdout) while a run holds run.lock.
SWITCH_SCRIPT = script_text("deploy_switch.sh")
#: Remove half-built envs ("$@"): rename out of the way first (one atomic step), then delete.
CLEAN_SCRIPT = script_text("deploy_clean.sh")


def script_argv(script: str, *args: str, name: str = "dfo-deploy") -> list[str]:
    """``bash -c SCRIPT NAME ARGS...``: values reach the script only as "$1"..."""
    return ["bash", "-c", script, name, *args]


def locked_argv(lock: str, owner: str, token: str, argv: list[str]) -> list[str]:
    """Run argv while holding the deploy flock and checking this deploy's lease."""
    return script_argv(LOCKED_SCRIPT, lock, owner, token, str(HEARTBEAT_S), *argv,
                       name="dfo-locked")


# --------------------------------------------------------------------------- state


def decode_b64(v: str) -> str:
    try:
        return base64.b64decode(v.encode(), validate=False).decode("utf-8", "replace")
    except (ValueError, TypeError):
        return ""


def _json(v: str) -> dict[str, Any] | None:
    try:
        d = json.loads(v)
    except (json.JSONDecodeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


def _fingerprint(v: str) -> EnvFingerprint | None:
    """fingerprint.json's record (None: it does not read)."""
    try:
        return parse_fingerprint(v)
    except ValueError:
        return None


def _marker(v: str) -> EnvComplete | None:
    """.dfo-complete's record (None: it is not a JSON object)."""
    d = _json(v)
    try:
        return None if d is None else EnvComplete.from_json(d)
    except ContractError:
        return None


@dataclass
class RemoteState:
    arch: str = ""
    uv_version: str = ""             # "uv 0.13.9 (...)" or ""
    current: str = ""                # readlink envs/current ("" when none)
    previous: str = ""
    target: str = "absent"           # complete | incomplete | absent
    current_marker: EnvComplete | None = None    # envs/current's .dfo-complete (None: none)
    current_fingerprint: EnvFingerprint | None = None
    current_freeze: str | None = None
    python: str = ""                 # interpreter path found for the profile ("" none)
    df_kb: int | None = None
    wheel_present: bool = False
    run_lock_held: bool = False
    run_lock_owner: str = ""
    deploy_owner: str = ""           # "TOKEN INFO"
    deploy_owner_age: int | None = None
    envs: dict[str, bool] = field(default_factory=dict)  # env dir name -> complete?
    complete_output: bool = False

    @property
    def current_name(self) -> str:
        return posixpath.basename(self.current.rstrip("/")) if self.current else ""

    @property
    def previous_name(self) -> str:
        return posixpath.basename(self.previous.rstrip("/")) if self.previous else ""


def state_probe(root: str, env_dir: str, python_spec: str, wheel: str) -> Probe[RemoteState]:
    """The deploy's state probe (``STATE_SCRIPT``): one round trip; a no-op redeploy is this.
    Its result's ``complete_output`` is False when the script did not run to its end."""
    return Probe("deploy-state", tuple(script_argv(STATE_SCRIPT, root, env_dir, python_spec, wheel,
                                                   name="dfo-state")),
                 parse_state_output)


def parse_state_output(out: Output) -> RemoteState:
    return parse_state(text(out.stdout))


def parse_state(output: str) -> RemoteState:
    s = RemoteState()
    for line in output.splitlines():
        key, _, val = line.partition("\t")
        if key == "arch":
            s.arch = val
        elif key == "uv":
            s.uv_version = val.strip()
        elif key == "current":
            s.current = val.strip()
        elif key == "previous":
            s.previous = val.strip()
        elif key == "target":
            s.target = val.strip()
        elif key == "current_marker":
            s.current_marker = _marker(decode_b64(val))
        elif key == "current_fingerprint":
            s.current_fingerprint = _fingerprint(decode_b64(val))
        elif key == "current_freeze":
            s.current_freeze = decode_b64(val)
        elif key == "python":
            s.python = val.strip()
        elif key == "df_kb":
            s.df_kb = int(val) if val.strip().isdigit() else None
        elif key == "wheel":
            s.wheel_present = val.strip() == "present"
        elif key == "run_lock":
            s.run_lock_held = val.strip() == "held"
        elif key == "run_lock_owner":
            s.run_lock_owner = decode_b64(val)
        elif key == "deploy_owner":
            s.deploy_owner = decode_b64(val).strip()
        elif key == "deploy_owner_age":
            s.deploy_owner_age = int(val) if val.strip().lstrip("-").isdigit() else None
        elif key == "env":
            state, _, name = val.partition(" ")
            s.envs[name] = state == "complete"
        elif key == "end":
            s.complete_output = True
    return s


def describe_run_lock(content: str) -> str:
    """Who holds run.lock, from its content (JSON with run_id/run, or a plain first line)."""
    text = content.strip()
    d = _json(text)
    if d:
        owner = RunLockOwner.from_json(d)
        if owner.holder:
            return f"run {owner.holder}" + (f" (pid {owner.pid})" if owner.pid else "")
    first = text.splitlines()[0].strip() if text else ""
    return f"run {first}" if first else "a run (run.lock holds no run id)"


def run_lock_error(host: str, root: str, content: str) -> LockHeldError:
    who = describe_run_lock(content)
    return LockHeldError(f"{who} holds {posixpath.join(root, 'locks', 'run.lock')} on {host}; "
                         f"deploy will not change envs/current under a live run",
                         hint="wait for it to finish or stop it (dfo stop), then deploy again")


def lease_owner(owner_line: str) -> tuple[str, LeaseHolder]:
    """``TOKEN INFO-JSON`` -> (token, holder)."""
    tok, _, rest = owner_line.strip().partition(" ")
    return tok, LeaseHolder.from_text(rest)


def describe_lease(owner_line: str) -> str:
    tok, info = lease_owner(owner_line)
    parts = []
    if info.user or info.machine:
        parts.append(f"{info.user or '?'}@{info.machine or '?'}")
    if info.pid:
        parts.append(f"pid {info.pid}")
    if info.started:
        parts.append(f"started {info.started}")
    return f"deploy {tok[:8]}" + (f" ({', '.join(parts)})" if parts else "")


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Step:
    stage: str
    run: bool
    reason: str


@dataclass
class Plan:
    action: str        # noop | create | repair | update | reuse | reverify | rollback
    target: str        # env dir name in envs/ (the new env, or the current one)
    steps: list[Step]
    clean: list[str] = field(default_factory=list)  # incomplete env dir names to remove
    drift: Drift | None = None
    mismatches: list[Mismatch] = field(default_factory=list)
    reinstall: bool = False
    sync: bool = True          # run `uv pip sync` in the install stage
    new_previous: str = ""     # what envs/previous becomes at switch ("" keeps it)
    retire: list[str] = field(default_factory=list)  # older complete envs the switch removes

    def runs(self, stage: str) -> bool:
        return any(s.stage == stage and s.run for s in self.steps)

    @property
    def noop(self) -> bool:
        return self.action == "noop"


def _uv_version_number(v: str) -> str:
    parts = v.split()
    return parts[1] if len(parts) >= 2 and parts[0] == "uv" else v.strip()


def uv_matches(remote: str, local: str) -> bool:
    return bool(remote) and _uv_version_number(remote) == _uv_version_number(local)


def current_drift(state: RemoteState, lock: Lock, wheel_remote: str | None) -> Drift:
    installed: dict[str, Installed] = parse_freeze(state.current_freeze or "")
    return diff(lock, installed, project="dfo", project_wheel=wheel_remote)


def next_generation(state: RemoteState, target: str, clean: list[str]) -> str:
    """A name for a new env of ``target``: the target itself while no env of it is left
    (half-built ones are removed first), else the generation after the newest one."""
    taken = [n for n in [*state.envs, state.current_name, state.previous_name]
             if n and n not in clean and env_generation(n)[0] == target]
    return generation_name(target, max(env_generation(n)[1] for n in taken) + 1) if taken \
        else target


def retired(state: RemoteState, envs: dict[str, bool], new: str, new_previous: str) -> list[str]:
    """Complete envs of the new current's and new previous's lock that the switch leaves
    neither current nor previous: older generations, removed once the switch is done."""
    prev = new_previous or state.previous_name
    bases = {env_generation(n)[0] for n in (new, prev) if n}
    return sorted(n for n, ok in envs.items()
                  if ok and n not in (new, prev) and env_generation(n)[0] in bases)


def make_plan(state: RemoteState, *, target: str, lock: Lock, expect: dict[str, Any],
              local_uv: str, wheel_remote: str, force: bool = False) -> Plan:
    """What a deploy must do to make ``envs/current`` a complete, verified env of ``target``.

    The env ``envs/current`` points to is never changed in place: a repair, an update or
    ``--force`` builds the next generation of it beside it (``<target>.<n>``), verifies it,
    marks it complete and only then switches to it, so a deploy that fails or is cut short
    at any stage leaves envs/current as it was. Only ``reverify`` (a probe, then a new
    fingerprint) works on the current env itself."""
    uv_step = Step("push uv", not uv_matches(state.uv_version, local_uv),
                   "uv missing" if not state.uv_version else
                   (f"{_uv_version_number(state.uv_version)} -> {_uv_version_number(local_uv)}"
                    if not uv_matches(state.uv_version, local_uv) else "same version"))
    envs = dict(state.envs)
    if state.target in ("complete", "incomplete"):
        envs.setdefault(target, state.target == "complete")
    cur = state.current_name
    cur_ok = bool(cur) and envs.get(cur, False)
    # half-built envs are removed, but never the one envs/current points to
    clean = sorted(n for n, ok in envs.items() if not ok and n != cur)
    is_current = cur_ok and env_generation(cur)[0] == target

    def steps(create: bool, install: str | None, verify: bool, switch: str | None) -> list[Step]:
        wheel_needed = install is not None
        return [
            Step("connect", True, "state probed"),
            uv_step if (create or install or verify) else Step("push uv", False, "not needed"),
            Step("push wheel", wheel_needed and not state.wheel_present,
                 "already there" if state.wheel_present else
                 ("new build" if wheel_needed else "not needed")),
            Step("create venv", create, "new env" if create else "exists"),
            Step("install", install is not None, install or "up to date"),
            Step("verify", verify, "probe the env" if verify else "fingerprint matches"),
            Step("switch", switch is not None, switch or "already current"),
        ]

    def rebuild(action: str, install: str, drift: Drift, mism: list[Mismatch]) -> Plan:
        new = next_generation(state, target, clean)
        return Plan(action, new, steps(True, install, True, f"from {cur} to {new}"), clean,
                    drift, mism, reinstall=force, new_previous=cur,
                    retire=retired(state, envs, new, cur))

    if is_current:
        drift = current_drift(state, lock, wheel_remote)
        marker = state.current_marker or EnvComplete()
        fp = state.current_fingerprint
        mism = compare(fp, expect) if fp is not None else []
        marker_ok = marker.lock_hash == lock.sha256
        if force:
            return rebuild("repair", "reinstall (--force), new env", drift, mism)
        if drift.packages_differ or not marker_ok:
            return rebuild("repair", "uv pip sync (drift), new env", drift, mism)
        if drift.project_differs:
            return rebuild("update", "uv pip sync + dfo wheel, new env", drift, mism)
        if not fp or mism:
            return Plan("reverify", cur, steps(False, None, True, None), clean, drift, mism)
        return Plan("noop", cur, steps(False, None, False, None), clean, drift, mism)

    prev = cur if cur_ok else ""
    done = sorted((n for n, ok in envs.items() if ok and env_generation(n)[0] == target),
                  key=lambda n: env_generation(n)[1])
    if done:
        # built before (e.g. the env we rolled back from): make sure it is exact, then switch
        got = state.previous_name if state.previous_name in done else done[-1]
        return Plan("reuse", got, steps(False, "uv pip sync", True, "to existing env"),
                    clean, new_previous=prev, reinstall=force,
                    retire=retired(state, envs, got, prev))
    new = next_generation(state, target, clean)
    return Plan("create", new, steps(True, "uv pip sync", True, "to new env"), clean,
                new_previous=prev, retire=retired(state, envs, new, prev))


def rollback_plan(state: RemoteState) -> Plan:
    from ..common.errors import DeployError

    if not state.previous_name:
        raise DeployError("no previous env to roll back to",
                          hint="envs/previous is set when a deploy switches envs/current")
    if not state.envs.get(state.previous_name):
        raise DeployError(f"the previous env {state.previous_name} is missing or incomplete",
                          hint="deploy again to build a good env")
    return Plan("rollback", state.previous_name, [
        Step("connect", True, "state probed"),
        Step("push uv", False, "not needed"),
        Step("push wheel", False, "not needed"),
        Step("create venv", False, "exists"),
        Step("install", False, "not needed"),
        Step("verify", True, "probe the previous env"),
        Step("switch", True, f"back to {state.previous_name}"),
    ], new_previous=state.current_name)


def check_disk(df_kb: int | None, need_mb: int, *, host: str, root: str) -> str | None:
    """An error message when the target has less free disk than the profile needs."""
    if df_kb is None or need_mb <= 0:
        return None
    free_mb = df_kb // 1024
    if free_mb < need_mb:
        return (f"disk full on {host}: {root} has {free_mb} MB free, the env needs about "
                f"{need_mb} MB")
    return None
