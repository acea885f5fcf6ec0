"""launch / status / stop through a Transport. Decisions come from ops.launch_plan (pure).

``RunOps(transport, host).plan(opts)`` validates everything before anything starts:
``--resume`` text, ``--set``, the run config (``trainer.config``, torch-free), ladders and
budgets; then on the host, in as few round trips as possible: reachable, env deployed and
``dfo deploy --check``-clean, run.lock free (or ``--replace``), compile-cache key known
(else a warning to run ``dfo warm-cache``), and the ``--resume`` checkpoint's manifest
verifies (else the error lists the ones that do). ``launch(opts)`` then writes the run dir
(config.yaml, spec.json), seeds the run's own compile cache and starts the supervisor
detached (systemd-run, or setsid), and waits until the supervisor has taken run.lock.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence


from ..config.runconfig import default_config_path
from ..errors import (ConfigError, ConnectError, DeployError, DfoError,
                     HostKeyError, LockHeldError, NotFoundError, RemoteCommandError, RunFailed)
from ..ops import launch_plan as lp
from ..ops import runstate as rs
from ..ops.budget import BudgetPolicy
from ..ops.fallback import merge_ladders, validate_ladders
from .run_query import RunQueries

log = logging.getLogger("dfo")

@dataclass
class LaunchOptions:
    config: str | None = None
    resume: str | None = None
    run_name: str | None = None
    sets: Sequence[str] = ()
    replace: bool = False
    dry_run: bool = False
    fault: str | None = None
    fault_node: int | None = None  # --group: the one node that gets the fault (None: all)
    backoff_scale: float = 1.0
    thresholds: Mapping[str, float] = field(default_factory=dict)
    budget: Mapping[str, Any] = field(default_factory=dict)
    fallbacks: Mapping[str, Any] | None = None
    env_check: bool = True
    start_timeout: float = 60.0
    new_lineage: bool = False     # move an earlier run's checkpoints aside, start over
    #: a foreign trainer (``dfo launch -- CMD ARGS...``, engine.byo_launch)
    command: Sequence[str] = ()
    run_file: str | None = None
    step_pattern: str | None = None
    resume_glob: str | None = None
    resume_order: str = "step"
    resume_args: Sequence[str] | str = ()   # a str is split into words (no shell)
    ladder: Sequence[str] = ()    # --ladder CLASS=KIND:VALUE, in order
    run_id: str | None = None     # given (engine.group_runs: one id on every node), else made
    #: the standby interpreter (supervisor.standby; --no-standby turns it off), and extra
    #: env given to the standby only (a test facility: a differing import-time key makes
    #: every standby be discarded)
    standby: bool = True
    standby_env: Mapping[str, str] = field(default_factory=dict)


class RunOps(RunQueries):
    def __init__(self, transport, host, *, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time, deploy_with: str | None = None):
        self.t = transport
        self.host = host
        #: what a missing env's hint tells to run (a group member: ``--group NAME``)
        self.deploy_with = deploy_with or f"--host {host.name}"
        self.layout = host.layout
        self.say = say or (lambda msg: log.info("%s", msg))
        self.clock = clock
        self._launching: str | None = None   # the run id a launch allocated (for messages)

    @property
    def python(self) -> str:
        return self.layout.current_python

    # --- probes ----------------------------------------------------------------------------
    def probe(self) -> dict[str, str]:
        r = self.t.run(lp.probe_argv(self.layout.root, self.layout.run_lock), timeout=60)
        r.check(f"probing {self.host.name}")
        return lp.parse_probe(r.out)

    def _require_env(self, probe: Mapping[str, str]) -> None:
        if probe.get("env") != "1":
            raise DeployError(f"no deployed env on {self.host.name} ({self.python} missing)",
                              hint=f"run `dfo deploy {self.deploy_with}` first")

    def _checkpoints(self, ck_dir: str) -> list[lp.CheckpointInfo]:
        r = self.t.run([self.python, "-m", "trainer.train.checkpoints", "list", ck_dir, "--json"],
                       timeout=120)
        if not r.ok:
            if "does not exist" in r.err or "No such file" in r.err or r.exit_code == 4:
                return []
            r.check("listing checkpoints")
        try:
            return lp.parse_checkpoint_listing(json.loads(r.out or "[]"))
        except ValueError:
            raise RemoteCommandError(f"listing checkpoints in {ck_dir}: output is not JSON") \
                from None

    # --- plan -------------------------------------------------------------------------------
    def plan(self, o: LaunchOptions) -> lp.LaunchPlan:
        if o.command or o.run_file or o.resume_glob or o.ladder:
            from .byo_launch import plan_byo

            return plan_byo(self, o)
        root = self.layout.root
        resume = lp.parse_resume(o.resume, root)          # before anything touches the host
        sets = lp.parse_sets(o.sets)
        from .demo import load_run_config

        cfg_path = o.config or default_config_path()
        run_name = lp.check_run_name(Path(cfg_path).stem if o.run_name is None else o.run_name)

        pairs = [(k, lp.render_value(v)) for k, v in sets.items()]
        cfg_nested, cfg_bytes = load_run_config(o.config, self.layout, pairs)
        base_no_sets = (lp.flatten(load_run_config(o.config, self.layout, [])[0]) if sets
                        else lp.flatten(cfg_nested))
        ladders = merge_ladders(
            validate_ladders(dict(self.host.fallbacks) or None,
                             source=f"{self.host.source or 'hosts.yaml'}: hosts.{self.host.name}.fallbacks"),
            validate_ladders(o.fallbacks, source="--fallbacks"))
        pol = dict(o.budget)
        pol["scale"] = o.backoff_scale
        policy = BudgetPolicy.from_json(pol)
        thr = lp.thresholds(o.thresholds)
        if o.fault:
            from dfo_contract.faultspec import parse_spec

            parse_spec(o.fault, source="--fault")

        from .preflight import launch_preflight

        probe, warnings = launch_preflight(self, o, cfg_nested,   # ONE round trip
                                           self.layout.checkpoints(run_name))
        key = self._cache_key(cfg_nested, warnings)

        now = self.clock()
        run_id = o.run_id or lp.make_run_id(run_name, now)
        run_dir = self.layout.run_dir(run_id)
        ck_dir = self.layout.checkpoints(run_name)
        resume_path = None
        aside = None
        if resume is not None:
            if o.new_lineage:
                raise ConfigError("--new-lineage starts over; it cannot be combined with --resume",
                                  hint="drop one of the two")
            resume_path, skipped = self._resolve_resume(resume, ck_dir)
            warnings.extend(skipped)
        elif probe.get("checkpoints") != "none":      # an earlier run may have left some
            aside = self._lineage_check(ck_dir, run_name, now, o.new_lineage)

        from ..ops.snapshot import cache_env, seed_run_cache_argvs

        env = cache_env(self.layout, key or "cold", run_dir)
        seed = seed_run_cache_argvs(self.layout, key or "cold", run_dir)
        cfg_remote = posixpath.join(run_dir, "config.yaml")
        spec = lp.build_spec(
            run_id=run_id, run_name=run_name, root=root, python=self.python,
            config_path=cfg_remote, base_config=base_no_sets,
            overrides=sets, resume_path=resume_path, checkpoint_dir=ck_dir, env=env,
            fault=o.fault, ladders=ladders, budget=policy.to_json(), thresholds_=thr,
            lock=self.layout.run_lock, restore_cache_argv=seed[-1], host=self.host.name)
        spec["config_bytes_len"] = len(cfg_bytes)
        spec["standby"] = bool(o.standby)
        if o.standby_env:
            spec["standby_env"] = {str(k): str(v) for k, v in o.standby_env.items()}
        systemd = probe.get("systemd") == "1"
        start = lp.start_argv(self.python, run_dir, run_id, systemd=systemd,
                              stop_timeout_s=thr["stop_timeout_s"])
        first = lp.trainer_argv(self.python, cfg_remote, sets, run_dir=run_dir,
                                checkpoint_dir=ck_dir, resume=resume_path,
                                layout={**base_no_sets, **sets}.get("parallel.layout"),
                                nproc=lp.ddp_nproc({**base_no_sets, **sets}))
        plan = lp.LaunchPlan(host=self.host.name, run_id=run_id, run_name=run_name,
                             run_dir=run_dir, mode="systemd" if systemd else "setsid",
                             start_argv=start, first_attempt_argv=first,
                             env=lp.attempt_env(env, attempt=1, run_dir=run_dir, fault=o.fault,
                                            run_id=run_id),
                             spec=spec, ladders=ladders, resume_path=resume_path,
                             warnings=warnings)
        plan.seed_argvs = seed
        plan.config_bytes = cfg_bytes
        plan.lock_owner = probe.get("lock_owner") if probe.get("lock") == "held" else None
        plan.move_aside = aside
        if aside:
            warnings.append(f"--new-lineage: the earlier checkpoints of {run_name} move to {aside}")
        return plan

    def _lineage_check(self, ck_dir: str, run_name: str, now: float,
                       new_lineage: bool) -> str | None:
        """A fresh launch must not share checkpoints/<run-name>/ with an earlier run: refuse,
        or (``--new-lineage``) name the dated directory the old checkpoints move to."""
        found = self._checkpoints(ck_dir)
        if not found:
            return None
        if not new_lineage:
            newest = found[0].name
            raise ConfigError(
                f"checkpoints/{run_name} already holds {len(found)} checkpoint(s) of an earlier "
                f"run (newest {newest})",
                hint="continue that run with --resume latest, or start over with --new-lineage "
                     "(moves them aside under a dated name, deletes nothing)")
        return f"{ck_dir.rstrip('/')}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"

    def _cache_key(self, cfg_nested: Mapping[str, Any], warnings: list[str]) -> str | None:
        from .compile_cache import CacheManager

        if not (cfg_nested.get("compile") or {}).get("enabled", True):
            return None  # nothing is compiled: no cache to advise about

        try:
            key = CacheManager(self.t, self.layout, host=self.host.name).key(cfg_nested).key
        except DfoError as e:
            warnings.append(f"compile-cache key unknown ({e}): run `dfo warm-cache`")
            return None
        live = posixpath.join(self.layout.cache, key)
        if not self.t.run(["test", "-d", live], timeout=60).ok:
            warnings.append(f"no warm compile cache for key {key} on {self.host.name}: "
                            "the first attempt compiles cold; run `dfo warm-cache`")
        return key

    def _resolve_resume(self, resume: lp.Resume, ck_dir: str) -> tuple[str, list[str]]:
        """The checkpoint path, and a warning for each torn one ``latest`` passed over."""
        if resume.kind == "path":
            parent, name = posixpath.split(resume.value.rstrip("/"))
            listing = self._checkpoints(parent)
            for c in listing:
                if c.name == name or c.path.rstrip("/") == resume.value:
                    if c.valid:
                        return resume.value, []
                    raise NotFoundError(f"--resume {resume.value}: checkpoint is incomplete or "
                                        f"corrupt ({c.why or 'manifest does not verify'})",
                                        hint="valid: " + (", ".join(
                                            x.name for x in listing if x.valid) or "none"))
            raise NotFoundError(f"--resume {resume.value}: not a checkpoint",
                                hint="valid in that dir: " + (", ".join(
                                    x.name for x in listing if x.valid) or "none"))
        listing = self._checkpoints(ck_dir)
        path = lp.resolve_resume(resume, listing, ck_dir)
        if resume.kind != "latest":
            return path, []
        return path, [lp.skipped_warning(c) for c in lp.skipped_by_latest(listing)]

    # --- launch -----------------------------------------------------------------------------
    def launch(self, o: LaunchOptions) -> lp.LaunchPlan:
        self._launching = None
        try:
            return self._launch(o)
        except HostKeyError:
            raise
        except ConnectError as e:
            raise lp.cut_off_error(e, self.host.name, self._launching) from None

    def _launch(self, o: LaunchOptions) -> lp.LaunchPlan:
        plan = self.plan(o)
        if o.dry_run:
            return plan
        if plan.lock_owner and o.replace:
            # stop first, then plan again: the checkpoint the stop saves is what
            # `--resume latest` must see
            self._stop_for_replace(plan.lock_owner, plan.spec["thresholds"]["stop_timeout_s"])
            plan = self.plan(o)
        return self.start_planned(plan, o)

    def start_planned(self, plan: lp.LaunchPlan, o: LaunchOptions, *,
                      wait: bool = True) -> lp.LaunchPlan:
        """Write ``plan``'s run dir and spec.json, start its supervisor and (``wait``) wait
        until it took run.lock (engine.group_runs starts every node, then waits)."""
        spec = plan.spec
        self._launching = plan.run_id
        if plan.move_aside:
            self.t.run(["mv", "-T", "-n", "--", spec["checkpoint_dir"], plan.move_aside],
                       timeout=60).check("moving the earlier checkpoints aside")
            if self.t.run(["test", "-e", spec["checkpoint_dir"]], timeout=60).ok:
                raise LockHeldError(f"{spec['checkpoint_dir']} could not be moved to "
                                    f"{plan.move_aside} (it exists)", hint="launch again")
            self.say(f"earlier checkpoints moved to {plan.move_aside}")
        parents, mine, *inside = lp.run_dir_argvs(plan.run_dir, self.layout.locks,
                                                  spec["checkpoint_dir"])
        self.t.run(parents, timeout=60).check("creating the run dir")
        if not self.t.run(mine, timeout=60).ok:   # exclusive: never share a run's directory
            raise LockHeldError(f"run directory {plan.run_dir} already exists (another launch "
                                "made it)", hint="launch again: it gets a new run id")
        for argv in inside:
            self.t.run(argv, timeout=60).check("creating the run dir")
        self.t.put(plan.config_bytes, spec["config_path"])
        for argv in plan.seed_argvs:
            self.t.run(argv, timeout=600).check("seeding the run's compile cache")
        self.t.put((json.dumps(spec, indent=1, sort_keys=True) + "\n").encode(),
                   posixpath.join(plan.run_dir, rs.SPEC_FILE))
        self.t.run(plan.start_argv, timeout=60).check("starting the supervisor")
        if wait:
            self._wait_started(plan.run_id, o.start_timeout)
        return plan

    def _stop_for_replace(self, owner: str, stop_timeout_s: float) -> None:
        self.say(f"stopping run {owner} (--replace)")
        self.stop(owner, timeout=stop_timeout_s + 30)
        deadline = time.monotonic() + 30
        while self.probe().get("lock") == "held":
            if time.monotonic() > deadline:
                raise LockHeldError(f"run {owner} still holds run.lock after stopping",
                                    hint="see `dfo status`; stop it with `dfo stop`")
            time.sleep(0.3)

    def _wait_started(self, run_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self._wait_lock_taken(run_id, min(deadline, time.monotonic() + 1.5))
            runs = self.status(run_id)
            if runs:
                last = runs[0]
                st = last.get("status")
                if st == "failed":
                    self._lost_the_lock(run_id, last)
                    raise RunFailed(f"run {run_id} failed at start: {last.get('reason')}")
                if st in rs.FINAL or (st in rs.LIVE and st != "starting" and last.get("live")):
                    return last
            time.sleep(0.3)
        log_tail = self._tail(posixpath.join(self.layout.run_dir(run_id), rs.SUPERVISOR_LOG))
        raise RunFailed(f"the supervisor of {run_id} did not start within {timeout:.0f}s"
                        + (f": {log_tail}" if log_tail else ""),
                        hint=f"see {self.layout.run_dir(run_id)}/supervisor.log")

    def _wait_lock_taken(self, run_id: str, until: float) -> None:
        """Until the supervisor of ``run_id`` holds run.lock (it is "running" a moment
        later), by the launch probe (a shell, no Python: cheap to repeat), or ``until``."""
        while time.monotonic() < until:
            p = self.probe()
            if p.get("lock") == "held" and p.get("lock_owner") == run_id:
                return
            time.sleep(0.05)

    def _lost_the_lock(self, run_id: str, info: Mapping[str, Any]) -> None:
        """A supervisor that ends ``failed`` at once while run.lock is held by another run
        lost the race for it (two launches at the same moment): that is exit 9, not 10."""
        probe = self.probe()
        owner = probe.get("lock_owner")
        if probe.get("lock") == "held" and owner and owner != run_id:
            raise LockHeldError(f"run {owner} is live on {self.host.name} (run.lock held); "
                                f"run {run_id} did not start ({info.get('reason')})",
                                hint=f"stop it with `dfo stop --run {owner}` or launch --replace")

    def _tail(self, path: str) -> str:
        try:
            text = self.t.get(path).decode("utf-8", "replace")
        except DfoError:
            return ""
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
