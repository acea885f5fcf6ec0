"""Planning ``dfo launch``, once, for every kind of run (pure: no I/O).

The engine (``engine/runs.py``, ``engine/group_runs.py``) does three things in order:

1. ``launch_inputs.prepare(options, trainer, host, now)``: every check of what was given,
   before the host is asked anything, and the run's name and id -> ``LaunchInputs`` (the
   bundled trainer's run config parsed once, ``--set`` applied once: a typed
   ``TrainerConfig`` that everything here reads);
2. ONE remote round trip for the facts (``facts_request`` says what to ask; the answer is
   ``plan.launch_facts.LaunchFacts``; the env check uses the same answer);
3. ``plan_launch(options, inputs, facts)`` (here) -> :class:`LaunchPlan`: the ``RunSpec``
   (spec.json) and what launch does on the host (``plan.launch_steps``).

The bundled trainer and an own command (``trainer``: :class:`BundledConfig` |
``launch_own.OwnConfig``), alone or as one node of a group (``role``: ``Solo`` | ``Group``),
go through the same functions.
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from dfo_contract import trainer_config as tcfg
from dfo_contract.runspec import (Budget, Bundled, Cache, Config, Group, Identity, Resume,
                                  ResumeChoice, RunSpec, Solo, Standby)
from dfo_contract.trainer_config import TrainerConfig

from ..common.errors import ConfigError, DeployError, LockHeldError, RemoteCommandError
from ..common import own_trainer
from . import cache_key as ck
from .devices import check_devices
from .init_from import effective, parse_reply
from ..common.launch_argv import attempt_env, start_argv, trainer_argv
from .launch_facts import (FactsRequest, LaunchFacts, checkpoint_listing, resolve_resume,
                           skipped_by_latest, skipped_warning)
from .launch_inputs import BundledConfig, LaunchInputs, LaunchOptions
from .launch_own import OwnConfig, resolve_resume as own_resume, resume_glob, shown_ladders
from .snapshot import cache_env, seed_run_cache_argvs


# --- what to ask the host -------------------------------------------------------------------

def config_paths(cfg: TrainerConfig) -> list[tuple[str, str]]:
    """(config key, path) of the paths a run needs on the host."""
    keys = [("model.target_path", cfg.model.target_path), ("data.path", cfg.data.path),
            ("data.eval_path", cfg.data.eval_path)]
    return [(k, v) for k, v in keys if isinstance(v, str) and v]


def own_cwd(inp: LaunchInputs) -> str:
    tr = inp.trainer
    return (tr.cwd if isinstance(tr, OwnConfig) else None) or inp.run_dir


def own_command(cmd: str, cwd: str) -> str:
    """Your own trainer's argv[0] as the host resolves it: a name stays a name (PATH); a
    relative path is relative to the command's working directory."""
    return cmd if "/" not in cmd else posixpath.normpath(posixpath.join(cwd, cmd))


_INTERPRETER = re.compile(r"^(python(\d+(\.\d+)?)?|bash|sh)$")


def own_script(command: Sequence[str], cwd: str) -> str | None:
    """The script an interpreter command runs (``python train.py``, ``bash run.sh``) as the
    host resolves it (a relative path from the command's working directory), or None."""
    if len(command) < 2 or not _INTERPRETER.match(posixpath.basename(command[0])) \
            or command[1].startswith("-"):
        return None
    return posixpath.normpath(posixpath.join(cwd, command[1]))


def own_dir_probe(cwd: str) -> str:
    """The path whose existence on the host says ``cwd`` is a directory (``DIR/.``)."""
    return posixpath.join(cwd, ".")


def raise_missing_own(host: str, inp: LaunchInputs, missing: Sequence[str]) -> None:
    """A run file's ``cwd:`` that is not a directory on the host, or the script an
    interpreter command names that is not there: refused before any run exists."""
    tr = inp.trainer
    assert isinstance(tr, OwnConfig)
    if tr.cwd and own_dir_probe(tr.cwd) in missing:
        raise ConfigError(f"run file: cwd: {tr.cwd} is not a directory on {host}",
                          hint="create it there or give the directory your trainer runs in")
    script = own_script(tr.command, own_cwd(inp))
    if script is not None and script in missing:
        given = tr.command[1]
        where = (f"a relative path is taken from the command's working directory, {own_cwd(inp)}"
                 + ("" if tr.cwd else ", the run's own new directory"))
        raise ConfigError(f"dfo launch: {tr.command[0]} {given}: {script} does not exist on "
                          f"{host} ({where})",
                          hint="give the script's absolute path on the host, or set `cwd:` in "
                               "a --run-file")


def raise_missing_command(host: str, command: str, missing: Sequence[str], cwd: str) -> None:
    """``dfo launch -- CMD`` whose CMD the host cannot run is refused before any run exists."""
    if not missing:
        return
    if "/" in command:
        raise ConfigError(f"dfo launch: the command {command} is not an executable file on "
                          f"{host}", hint="give the path of your trainer on the host (a "
                          f"relative path is taken from {cwd}), or run it through its "
                          "interpreter: dfo launch -- python PATH")
    raise ConfigError(f"dfo launch: the command {command!r} is not found on {host} (PATH, with "
                      "the deployed env's bin first)", hint="give its full path on the host")


def facts_request(o: LaunchOptions, inp: LaunchInputs, host) -> FactsRequest:
    """What the one pre-launch round trip asks (the env check's fields are the engine's)."""
    tree = host.tree
    base = dict(root=tree.root, run_lock=tree.run_lock, promote=not o.dry_run,
                fingerprint=posixpath.join(tree.current_env, "fingerprint.json"))
    tr = inp.trainer
    if isinstance(tr, OwnConfig):
        latest = inp.resume.kind == "latest"
        script = own_script(tr.command, own_cwd(inp))
        return FactsRequest(**base, paths=(inp.resume.value,) if inp.resume.path else (),
                            own_paths=((own_dir_probe(tr.cwd),) if tr.cwd else ())
                            + ((script,) if script else ()),
                            commands=(own_command(tr.command[0], own_cwd(inp)),),
                            glob=resume_glob(tr, own_cwd(inp)) if latest else None)
    dirs = [tree.checkpoints(inp.run_name)]
    if inp.resume.kind == "path":
        dirs.append(posixpath.dirname(inp.resume.value.rstrip("/")))
    cfg = tr.config
    compiled = cfg.compile.enabled
    target = ck.target_config_path(cfg) if compiled else None
    return FactsRequest(**base, paths=tuple(v for _, v in config_paths(cfg)),
                        ckpt_dirs=tuple(dirs), source=compiled,
                        hashes=(target,) if target else (), caches=tree.cache if compiled else "",
                        init_from=cfg.model.init_from)


# --- the plan -------------------------------------------------------------------------------

@dataclass
class LaunchPlan:
    spec: RunSpec
    run_dir: str
    mode: str                       # "systemd" | "setsid"
    start_argv: list[str]
    first_attempt_argv: list[str]
    env: dict[str, str]             # attempt 1's env
    shown_ladders: dict[str, list[str]]
    warnings: list[str] = field(default_factory=list)
    #: what ``launch`` does on the host before it starts the supervisor (plan.launch_steps)
    seed_argvs: list[list[str]] = field(default_factory=list)   # seed the run's compile cache
    config_bytes: bytes = b""                                   # the run config file, as is
    lock_owner: str | None = None                               # the live run --replace stops
    move_aside: str | None = None      # --new-lineage: where the earlier checkpoints go
    record: tuple[str, bytes] | None = None   # the env check's verification record to write

    @property
    def host(self) -> str:
        return self.spec.identity.host

    @property
    def run_id(self) -> str:
        return self.spec.identity.run_id

    @property
    def run_name(self) -> str:
        return self.spec.identity.run_name

    @property
    def resume(self) -> ResumeChoice:
        """Where attempt 1 starts, resolved: scratch or a checkpoint path."""
        return self.spec.resume.start

    @property
    def resume_path(self) -> str | None:
        return self.spec.resume.path

    def to_json(self) -> dict:
        return {"host": self.host, "run_id": self.run_id, "run_name": self.run_name,
                "run_dir": self.run_dir, "mode": self.mode, "start_argv": self.start_argv,
                "first_attempt_argv": self.first_attempt_argv, "env": self.env,
                "ladders": self.shown_ladders, "resume": self.resume_path,
                "warnings": self.warnings, "budget": self.spec.budget.to_json(),
                "thresholds": self.spec.thresholds.to_json(), "move_aside": self.move_aside,
                "standby": self.spec.standby.enabled}


#: what an error names as the run config when no --config was given
DEFAULT_CONFIG = "the default config (the demo's)"


def raise_missing(host: str, keys: Sequence[tuple[str, str]], missing: Sequence[str],
                  config: str | None) -> None:
    """A launch that cannot train is refused here rather than failing in attempt 1."""
    gone = set(missing)
    for k, v in keys:
        if v in gone:
            where = config or DEFAULT_CONFIG
            fix = (f"run `dfo demo --host {host}` to make the demo's assets, or pass --config"
                   if not config else f"fix {k} in {config} or pass --set {k}=PATH")
            raise ConfigError(f"{k} of {where}: {v} does not exist on {host}", hint=fix)


def _listing(facts: LaunchFacts, ck_dir: str):
    try:
        return checkpoint_listing(facts, ck_dir)
    except ValueError as e:
        if not facts.answered:
            raise DeployError(f"the deployed env cannot answer launch's facts ({e})",
                              hint="run `dfo deploy` to bring the env up to this dfo") from None
        raise RemoteCommandError(f"listing checkpoints in {ck_dir}: {e}") from None


def run_config(cfg: BundledConfig, facts: LaunchFacts, host: str) -> TrainerConfig:
    """The config the trainer runs: ``cfg.config`` with the settings of its
    ``model.init_from`` drafter directory (config.json as the facts brought it); ConfigError
    for a directory that is missing or that the trainer would refuse."""
    path = cfg.config.model.init_from
    if not path:
        return cfg.config
    reply = None if facts.init_from is None else parse_reply(path, facts.init_from)
    return effective(cfg.config, reply, host=host, config=cfg.source)


def _cache_key(cfg: BundledConfig, full: TrainerConfig, facts: LaunchFacts, host: str,
               warnings: list[str]) -> str | None:
    """The compile-cache key of ``full`` (the config in force, ``run_config``) (None:
    nothing is compiled, or its inputs are unknown)."""
    if not cfg.config.compile.enabled:
        return None  # nothing is compiled: no cache to advise about
    fp, src = facts.fingerprint, facts.source_hash
    if fp is None or src is None:
        why = ("no deployed env fingerprint (fingerprint.json missing)" if fp is None else
               "the env has no trainer or dfo_contract package (or an older dfo wheel)")
        warnings.append(f"compile-cache key unknown ({why}): run `dfo warm-cache`")
        return None
    key = ck.config_key(fp, full, trainer_source=src, file_hash=facts.file_hash).key
    if key not in facts.caches:
        warnings.append(f"no warm compile cache for key {key} on {host}: "
                        "the first attempt compiles cold; run `dfo warm-cache`")
    return key


def _lineage(facts: LaunchFacts, ck_dir: str, run_name: str, now: float,
             new_lineage: bool) -> str | None:
    """A fresh launch must not share checkpoints/<run-name>/ with an earlier run: refuse,
    or (``--new-lineage``) name the dated directory the old checkpoints move to."""
    found = _listing(facts, ck_dir)
    if not found:
        return None
    if not new_lineage:
        raise ConfigError(
            f"checkpoints/{run_name} already holds {len(found)} checkpoint(s) of an earlier "
            f"run (newest {max(found, key=lambda c: c.step).name})",
            hint="continue that run with --resume latest, or start over with --new-lineage "
                 "(moves them aside under a dated name, deletes nothing)")
    return f"{ck_dir.rstrip('/')}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"


@dataclass
class _Part:
    """What one kind of trainer contributes to the plan."""
    config: Config
    cache: Cache
    trainer: Bundled | Any
    ck_dir: str
    resume: ResumeChoice            # resolved: scratch or a path
    env: dict[str, str]
    first: list[str]
    shown: dict[str, list[str]]
    data: bytes                     # the config file shipped with the run
    seed: list[list[str]] = field(default_factory=list)
    aside: str | None = None


def plan_launch(o: LaunchOptions, inp: LaunchInputs, facts: LaunchFacts, *, host,
                role: Solo | Group | None = None,
                resolved: ResumeChoice | None = None) -> LaunchPlan:
    """The run ``inp`` on ``host`` given the host's ``facts``. ``role``: a group's node;
    ``resolved``: where attempt 1 starts, already resolved (scratch or a path: a group's
    other nodes take the head's; they resolve nothing and guard no checkpoints); None:
    ``inp.resume`` is resolved here against the host's checkpoints."""
    role = role or Solo()
    tree = host.tree
    if facts.launch.held and not o.replace:
        owner = facts.launch.lock_owner or "another run"
        raise LockHeldError(f"run {owner} is live on {host.name} (run.lock held)",
                            hint=f"stop it with `dfo stop --run {owner}` or launch --replace")
    warnings = [] if o.env_check else ["env check skipped (--no-env-check)"]
    part = (_own(inp, facts, resolved, host.name) if isinstance(inp.trainer, OwnConfig) else
            _bundled(o, inp, facts, host, role, resolved, warnings))
    python = tree.current_python
    spec = RunSpec(
        identity=Identity(run_id=inp.run_id, run_name=inp.run_name, host=host.name,
                          root=tree.root, python=python, lock=tree.run_lock),
        config=part.config, resume=Resume.of(part.ck_dir, part.resume),
        thresholds=inp.thresholds, budget=Budget(**vars(inp.budget)),
        ladders={k: tuple(v) for k, v in inp.ladders.items()}, cache=part.cache,
        standby=Standby(enabled=bool(o.standby),
                        env={str(k): str(v) for k, v in o.standby_env.items()}),
        trainer=part.trainer, role=role)
    systemd = facts.launch.has_systemd
    held = facts.launch.held
    if part.aside:
        # shown once the launch is over (or for --dry-run, as what it would do)
        warnings.append(f"--new-lineage: the earlier checkpoints of {inp.run_name} "
                        f"{'would move' if o.dry_run else 'moved'} to {part.aside}")
    return LaunchPlan(spec=spec, run_dir=inp.run_dir, mode="systemd" if systemd else "setsid",
                      start_argv=start_argv(python, inp.run_dir, inp.run_id, systemd=systemd,
                                            stop_timeout_s=inp.thresholds.stop_timeout_s),
                      first_attempt_argv=part.first, env=part.env, shown_ladders=part.shown,
                      warnings=warnings, seed_argvs=part.seed, config_bytes=part.data,
                      lock_owner=facts.launch.lock_owner if held else None,
                      move_aside=part.aside, record=None if o.dry_run else facts.record)


def _own(inp: LaunchInputs, facts: LaunchFacts, resolved: ResumeChoice | None,
         host: str) -> _Part:
    tr = inp.trainer
    assert isinstance(tr, OwnConfig)
    raise_missing_own(host, inp, facts.missing)
    raise_missing_command(host, own_command(tr.command[0], own_cwd(inp)),
                          facts.missing_commands, own_cwd(inp))
    if resolved is None:
        found = facts.glob_matches()
        resolved = inp.resume if inp.resume.is_scratch else ResumeChoice.at(own_resume(
            inp.resume.value, tr, own_cwd(inp), found, facts.missing))
    return _Part(config=Config(path=posixpath.join(inp.run_dir, "run-file.yaml")),
                 cache=Cache(), trainer=tr.trainer(), ck_dir=inp.run_dir,
                 resume=resolved, data=tr.data,
                 env=attempt_env(tr.env, attempt=1, run_dir=inp.run_dir, fault=None,
                                 run_id=inp.run_id),
                 first=own_trainer.attempt_argv(tr.command, own_trainer.Changes(),
                                                resume_path=resolved.path,
                                        resume_args=tr.resume.args if tr.resume else ()),
                 shown=shown_ladders(tr))


def _bundled(o: LaunchOptions, inp: LaunchInputs, facts: LaunchFacts, host,
             role: Solo | Group, resolved: ResumeChoice | None, warnings: list[str]) -> _Part:
    tr, tree, run_dir = inp.trainer, host.tree, inp.run_dir
    assert isinstance(tr, BundledConfig)
    cfg = tr.config
    raise_missing(host.name, config_paths(cfg), facts.missing, tr.source)
    check_devices(tcfg.flat(cfg), facts.fingerprint, host=host.name, source=tr.source or DEFAULT_CONFIG)
    cfg_path, ck_dir = posixpath.join(run_dir, "config.yaml"), tree.checkpoints(inp.run_name)
    key = _cache_key(tr, run_config(tr, facts, host.name), facts, host.name, warnings)
    aside = None
    if resolved is None:
        resolved = inp.resume
        if not inp.resume.is_scratch:
            path, skipped = _resolve(inp.resume, facts, ck_dir)
            resolved = ResumeChoice.at(path)
            warnings.extend(skipped)
        elif not (isinstance(role, Group) and not role.is_head):
            aside = _lineage(facts, ck_dir, inp.run_name, inp.now, o.new_lineage)
    resume_path = resolved.path
    cache_vars = cache_env(tree, key or "cold", run_dir)
    seed = seed_run_cache_argvs(tree, key or "cold", run_dir)
    fault = o.fault if o.fault_node is None or not isinstance(role, Group) \
        or role.node == o.fault_node else None
    sets, bundled = tr.layers.sets, Bundled.of(cfg, fault)
    if isinstance(role, Group):
        from .group_launch import node_attempt_argv

        first = node_attempt_argv(tree.current_python, cfg_path, sets, run_dir=run_dir,
                                  checkpoint_dir=ck_dir, resume=resume_path, spec=role,
                                  run_id=inp.run_id)
    else:
        first = trainer_argv(tree.current_python, cfg_path, sets, run_dir=run_dir,
                             checkpoint_dir=ck_dir, resume=resume_path,
                             layout=bundled.layout, nproc=bundled.nproc)
    return _Part(config=Config(path=cfg_path, base=dict(tr.layers.base), overrides=dict(sets)),
                 cache=Cache(key=key, env=cache_vars, restore_argv=tuple(seed[-1])),
                 trainer=bundled, ck_dir=ck_dir, resume=resolved, data=tr.layers.data,
                 env=attempt_env(cache_vars, attempt=1, run_dir=run_dir, fault=fault,
                                 run_id=inp.run_id),
                 first=first, shown={k: list(v) for k, v in inp.ladders.items()},
                 seed=seed, aside=aside)


def _resolve(resume: ResumeChoice, facts: LaunchFacts, ck_dir: str) -> tuple[str, list[str]]:
    """The checkpoint path, and a warning for each torn one ``latest`` passed over."""
    where = posixpath.dirname(resume.value.rstrip("/")) if resume.kind == "path" else ck_dir
    listing = _listing(facts, where)
    path = resolve_resume(resume, listing, where)
    if resume.kind != "latest":
        return path, []
    return path, [skipped_warning(c) for c in skipped_by_latest(listing)]
