"""The one round trip ``dfo launch`` makes before it plans (``plan.launch_facts``): the host's
facts, and the env check made from them. Each problem keeps its own error and exit code:
no deployed env (7), an env that differs from its lock (7); the rest (run.lock held, a
config path missing, a checkpoint) the planner decides from the same facts."""

from __future__ import annotations

import dataclasses
import logging

from ..common.errors import DeployError, DriftError, RemoteCommandError
from ..plan import launch_plan as lp
from ..plan.launch_inputs import LaunchInputs, LaunchOptions
from ..plan.launch_facts import LaunchFacts, facts_argv, parse_facts

log = logging.getLogger("dfo")

#: the facts command's limit: the env probe (imports torch, a GPU smoke test) may run in it
CHECK_TIMEOUT = 720.0
PLAIN_TIMEOUT = 120.0


def require_env(facts: LaunchFacts, host: str, python: str, deploy_with: str) -> None:
    if not facts.launch.has_env:
        raise DeployError(f"no deployed env on {host} ({python} missing)",
                          hint=f"run `dfo deploy {deploy_with}` first")


def launch_facts(run_ops, o: LaunchOptions, inp: LaunchInputs, *, switched: bool = False) -> LaunchFacts:
    """Reachable, env deployed and ``deploy --check``-clean (the env probe only when its
    recorded verification does not hold), and everything the planner needs: ONE command.
    When only dfo's own wheel differs (another dfo deployed its wheel since) and this dfo's
    wheel is still on the host, it is switched back in (``Deployer.switch_dfo_wheel``) and
    the facts asked once more: no redeploy."""
    from .deploy import Deployer  # deploy imports much; launch only needs it here

    req = lp.facts_request(o, inp, run_ops.host)
    dep = Deployer(run_ops.transport, run_ops.host) if o.env_check else None
    if dep is not None:
        req = dataclasses.replace(req, check=True, env_dir=dep.local_facts()[2],
                                  python_spec=dep.python_spec(), wheel=dep.wheel_remote())
    r = run_ops.transport.run(facts_argv(req), timeout=CHECK_TIMEOUT if dep else PLAIN_TIMEOUT)
    facts = parse_facts(r.out)
    if not facts.complete:
        r.check(f"probing {run_ops.host.name}")
        raise RemoteCommandError(f"probing {run_ops.host.name}: the probe did not finish",
                                 hint="the host needs bash and coreutils")
    require_env(facts, run_ops.host.name, run_ops.python, run_ops.deploy_with)
    if dep is not None:
        rep, facts.record = dep.launch_check(facts)
        if not rep.ok and rep.dfo_only and facts.state is not None:
            mine = dep.wheel()
            if facts.state.wheel_present and not switched and not o.dry_run \
                    and not facts.state.run_lock_held:
                log.warning("%s: envs/current has another dfo's wheel (%s); switching it to "
                            "this dfo's (%s), kept on the host from an earlier deploy",
                            run_ops.host.name, rep.dfo_only, mine.filename)
                dep.switch_dfo_wheel(facts.state)
                return launch_facts(run_ops, o, inp, switched=True)
            if facts.state.wheel_present and o.dry_run:
                log.warning("%s: envs/current has another dfo's wheel (%s); a launch switches "
                            "it to this dfo's (%s)", run_ops.host.name, rep.dfo_only, mine.filename)
                return facts
            fix = (f"run `dfo deploy {run_ops.deploy_with}` with this dfo (it keeps each dfo's wheel "
                   "on the host: later launches from either dfo switch without a redeploy)")
            if facts.state.wheel_present:
                fix = ("a live run holds the env: stop it (`dfo stop`), then launch again (this "
                       "dfo's wheel, already on the host, is switched in then)")
            raise DriftError(
                f"{run_ops.host.name}: envs/current has another dfo's wheel ({rep.dfo_only}), not "
                f"this dfo's ({mine.filename}, sha256 {mine.short}); only dfo's own version "
                "differs, the lock's packages match", hint=fix)
        if not rep.ok:
            first = rep.drift[0] if rep.drift else ""
            raise DriftError(f"{run_ops.host.name}: envs/current differs from its lock "
                             f"({len(rep.drift)} difference(s), first: {first})",
                             hint="run `dfo deploy` to repair it")
        log.info("env check on %s: %s", run_ops.host.name, rep.message)
    return facts
