"""Checks ``dfo launch`` makes on the host before anything starts, in ONE round trip
(``ops.launch_facts``): reachable, env deployed and clean, run.lock, the config's paths."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import logging

from ..errors import ConfigError, DriftError, LockHeldError, RemoteCommandError
from ..ops import launch_plan as lp
from ..ops.launch_facts import facts_argv, parse_facts

log = logging.getLogger("dfo")


def config_paths(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(config key, path) of the paths a run needs on the host."""
    keys = [("model.target_path", (cfg.get("model") or {}).get("target_path")),
            ("data.path", (cfg.get("data") or {}).get("path"))]
    return [(k, v) for k, v in keys if isinstance(v, str) and v]


def raise_missing(host: str, keys: Sequence[tuple[str, str]], missing: Sequence[str],
                  config: str | None) -> None:
    """A launch that cannot train is refused here rather than failing in attempt 1."""
    gone = set(missing)
    for k, v in keys:
        if v in gone:
            where = config or "the default config tiny-cpu.yaml"
            fix = (f"run `dfo demo --host {host}` to make the demo's assets, or pass --config"
                   if not config else f"fix {k} in {config} or pass --set {k}=PATH")
            raise ConfigError(f"{k} of {where}: {v} does not exist on {host}", hint=fix)


def check_config_paths(t, host: str, cfg: Mapping[str, Any], config: str | None) -> None:
    """The config's target and data paths exist on the host (one remote probe)."""
    keys = config_paths(cfg)
    if not keys:
        return
    r = t.run(lp.missing_paths_argv([v for _, v in keys]), timeout=60)
    r.check(f"checking the config's paths on {host}")
    raise_missing(host, keys, r.out.splitlines(), config)


def refuse_held_run_lock(host: str, probe: Mapping[str, Any], *, replace: bool) -> None:
    """A live run holds the host's run.lock (the launch probe says so): LockHeldError, unless
    the launch replaces it (``--replace``)."""
    if probe.get("lock") == "held" and not replace:
        owner = probe.get("lock_owner") or "another run"
        raise LockHeldError(f"run {owner} is live on {host} (run.lock held)",
                            hint=f"stop it with `dfo stop --run {owner}` or launch --replace")


def launch_preflight(ops, o, cfg: Mapping[str, Any],
                     ck_dir: str = "") -> tuple[dict[str, str], list[str]]:
    """Reachable, env deployed and ``deploy --check``-clean (the env probe only when its
    recorded verification no longer holds), run.lock free, the config's paths exist:
    the facts come back from ONE remote command; each problem keeps its own error."""
    from .deploy import Deployer  # deploy imports much; launch only needs it here

    dep = Deployer(ops.t, ops.host) if o.env_check else None
    env_dir = dep._local_facts()[2] if dep else ""
    paths = config_paths(cfg)
    argv = facts_argv(ops.layout.root, ops.layout.run_lock, env_dir,
                      dep.python_spec() if dep else "", dep.wheel_remote() if dep else "",
                      check=dep is not None, paths=[v for _, v in paths],
                      checkpoint_dir=ck_dir)
    r = ops.t.run(argv, timeout=120)
    facts = parse_facts(r.out)
    if not facts.complete:
        r.check(f"probing {ops.host.name}")
        raise RemoteCommandError(f"probing {ops.host.name}: the probe did not finish",
                                 hint="the host needs bash and coreutils")
    probe = facts.launch
    ops._require_env(probe)
    warnings: list[str] = []
    if dep is not None:
        rep = dep.launch_check(facts)
        if not rep.ok:
            first = rep.drift[0] if rep.drift else ""
            raise DriftError(f"{ops.host.name}: envs/current differs from its lock "
                             f"({len(rep.drift)} difference(s), first: {first})",
                             hint="run `dfo deploy` to repair it")
        log.info("env check on %s: %s", ops.host.name, rep.message)
    else:
        warnings.append("env check skipped (--no-env-check)")
    refuse_held_run_lock(ops.host.name, probe, replace=o.replace)
    raise_missing(ops.host.name, paths, facts.missing, o.config)
    return probe, warnings
