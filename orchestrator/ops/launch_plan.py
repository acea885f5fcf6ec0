"""Pure planning for ``dfo launch``: input validation, the supervisor's start argv, the
trainer argv of an attempt, and the probe script launch runs first. No I/O here.

Nothing a user types reaches a shell: ``--resume`` is a checkpoint name, ``latest`` or a
path under the host's root made of plain characters; every remote shell script is a
constant that takes its values as positional parameters (``"$1"``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dfo_contract import envvars

from ..errors import ConfigError, NotFoundError
from .run_identity import RUN_ID_SUFFIX, cut_off_error, make_run_id, run_dir_argvs  # noqa: F401
from .probes import LAUNCH_PROBE_SCRIPT, launch_probe, parse_launch_probe
from .thresholds import DEFAULT_THRESHOLDS, ZERO_OK, thresholds  # noqa: F401  (callers use lp.thresholds)

STEP_NAME = re.compile(r"^step_(\d{1,12})$")
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+=-]*$")
SET_KEY = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")

#: keys launch owns; --set may not change them
RESERVED_KEYS = frozenset({"run.dir", "checkpoint.dir", "fault.spec"})


# --- --resume --------------------------------------------------------------------------

@dataclass(frozen=True)
class Resume:
    kind: str          # "latest" | "name" | "path"
    value: str         # "latest", "step_690", or an absolute normalized path

    def to_json(self) -> dict:
        return {"kind": self.kind, "value": self.value}


def parse_resume(value: str | None, root: str) -> Resume | None:
    """Validate ``--resume``. Raises ConfigError for anything but a checkpoint name
    (``step_N``), ``latest``, or an absolute path under ``root`` with plain characters."""
    if value is None:
        return None
    v = value.strip()
    how = f"use a checkpoint name like step_690, 'latest', or a path under {root}"
    if v == "latest":
        return Resume("latest", v)
    if STEP_NAME.match(v):
        return Resume("name", v)
    if v.startswith("/"):
        if not SAFE_PATH.match(v) or any(p == ".." for p in v.split("/")):
            raise ConfigError(f"--resume: {value!r} is not a plain path", hint=how)
        norm = posixpath.normpath(v)
        rootn = posixpath.normpath(root)
        if not (norm + "/").startswith(rootn.rstrip("/") + "/") or norm == rootn:
            raise ConfigError(f"--resume: {value!r} is outside the host's root {root}", hint=how)
        return Resume("path", norm)
    raise ConfigError(f"--resume: {value!r} is not a checkpoint name", hint=how)


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    step: int
    path: str
    valid: bool
    why: str = ""


def parse_checkpoint_listing(obj: Any) -> list[CheckpointInfo]:
    """Read ``python -m trainer.train.checkpoints list DIR --json`` output (already JSON-decoded).

    Accepts a list of entries or ``{"checkpoints": [...]}``; each entry has ``name``/``path``,
    ``step`` and ``valid`` (plus ``reason``/``why``/``error`` when invalid)."""
    if isinstance(obj, Mapping):
        obj = obj.get("checkpoints", [])
    out = []
    for e in obj or []:
        if not isinstance(e, Mapping):
            continue
        path = str(e.get("path") or "")
        name = str(e.get("name") or posixpath.basename(path))
        step = e.get("step")
        if not isinstance(step, int):
            m = STEP_NAME.match(name)
            step = int(m.group(1)) if m else -1
        why = str(e.get("reason") or e.get("why") or e.get("error") or "")
        out.append(CheckpointInfo(name, step, path, bool(e.get("valid")), why))
    return sorted(out, key=lambda c: c.step)


def skipped_by_latest(listing: Sequence[CheckpointInfo]) -> list[CheckpointInfo]:
    """The torn/incomplete checkpoints newer than the newest valid one: what ``--resume
    latest`` passes over (each is named in a warning)."""
    valid = [c.step for c in listing if c.valid]
    floor = max(valid) if valid else -1
    return [c for c in listing if not c.valid and c.step > floor]


def skipped_warning(c: CheckpointInfo) -> str:
    return (f"--resume latest: skipping checkpoint {c.name} "
            f"({c.why or 'incomplete or torn: its manifest does not verify'})")


def resolve_resume(resume: Resume, listing: Sequence[CheckpointInfo], ckpt_dir: str) -> str:
    """The checkpoint path a ``--resume`` names; NotFoundError lists the valid ones."""
    valid = [c for c in listing if c.valid]
    have = ", ".join(c.name for c in valid) or "none"
    if resume.kind == "latest":
        if not valid:
            raise NotFoundError(f"--resume latest: no valid checkpoint in {ckpt_dir}",
                                hint="launch without --resume to start from scratch")
        return valid[-1].path or posixpath.join(ckpt_dir, valid[-1].name)
    if resume.kind == "name":
        for c in listing:
            if c.name == resume.value:
                if c.valid:
                    return c.path or posixpath.join(ckpt_dir, c.name)
                raise NotFoundError(f"--resume {resume.value}: checkpoint is incomplete or corrupt"
                                    f" ({c.why or 'manifest does not verify'})",
                                    hint=f"valid checkpoints in {ckpt_dir}: {have}")
        raise NotFoundError(f"--resume {resume.value}: no such checkpoint in {ckpt_dir}",
                            hint=f"valid checkpoints: {have}")
    return resume.value  # a path: verified by the caller with the manifest check


# --- run names and --set --------------------------------------------------------------

def check_run_name(name: str) -> str:
    if not RUN_NAME.match(name or ""):
        raise ConfigError(f"--run-name: {name!r} is not a valid run name",
                          hint="use letters, digits, '.', '_' or '-', at most 48 characters")
    return name


def missing_paths_argv(paths: Sequence[str]) -> list[str]:
    """One remote probe: prints each of ``paths`` that does not exist, one a line (the
    paths are arguments, never part of the script)."""
    script = 'for p in "$@"; do [ -e "$p" ] || printf "%s\\n" "$p"; done'
    return ["sh", "-c", script, "sh", *paths]



def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``--set train.micro_batch=4`` -> {"train.micro_batch": 4} (values read as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE",
                              hint="e.g. --set train.micro_batch=4")
        k, v = item.split("=", 1)
        k = k.strip()
        if not SET_KEY.match(k):
            raise ConfigError(f"--set {item!r}: key must be SECTION.FIELD",
                              hint="e.g. --set compile.gate=false")
        if k in RESERVED_KEYS:
            raise ConfigError(f"--set {k}: set by dfo launch itself",
                              hint="use --run-name / --fault instead")
        try:
            out[k] = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            out[k] = v
    return out


def render_value(v: Any) -> str:
    """A config value as the trainer's flag text (``true``, ``4``, ``[cuda:0,cuda:1]``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(render_value(x) for x in v) + "]"
    return str(v)


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
    """One ``--KEY=VALUE`` token per override: a value can never be read by the trainer
    as a flag of its own (``--set data.path=--resume=/x`` stays data.path's value)."""
    return [f"--{k}={render_value(overrides[k])}" for k in sorted(overrides)]


def flatten(d: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (sections of fields) -> flat dotted keys."""
    out: dict[str, Any] = {}
    for sec, body in d.items():
        if isinstance(body, Mapping):
            for k, v in body.items():
                out[f"{sec}.{k}"] = v
    return out


# --- the attempt's trainer argv ------------------------------------------------------------

def ddp_nproc(cfg: Mapping[str, Any]) -> int:
    """Processes for layout ddp: one per distinct CUDA device named in the config (1 on CPU)."""
    devs = [d for d in list(cfg.get("parallel.drafter_devices") or [])
            if isinstance(d, str) and d.startswith("cuda")]
    return max(1, len(set(devs)))


@dataclass(frozen=True)
class Rendezvous:
    """One node's attempt of a multi-node run: torchrun's c10d rendezvous, hosted by the
    head's torchrun only (``is_host``; on loopback every node would guess it is the host)."""
    nnodes: int
    head_addr: str
    port: int
    rdzv_id: str          # fresh per attempt (GroupSpec.rdzv_id): never a stale round
    is_host: bool
    local_addr: str | None = None  # else rank 0 advertises a hostname others may not resolve

    def flags(self) -> list[str]:
        host = f"[{self.head_addr}]" if ":" in self.head_addr else self.head_addr
        local = [f"--local-addr={self.local_addr}"] if self.local_addr else []
        return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={host}:{self.port}", f"--rdzv-id={self.rdzv_id}",
                f"--rdzv-conf=is_host={1 if self.is_host else 0}", *local, "--max-restarts=0"]


def trainer_argv(python: str, config_path: str, overrides: Mapping[str, Any], *,
                 run_dir: str, checkpoint_dir: str, resume: str | None,
                 layout: str | None = None, nproc: int = 1,
                 rdzv: Rendezvous | None = None) -> list[str]:
    """``python -m trainer train ...`` through the supervisor's shim (under
    ``torch.distributed.run`` for ddp; with ``rdzv`` one node of a multi-node run: always
    the ddp layout, ``--max-restarts 0``: the supervisors restart the run as a whole)."""
    if rdzv is not None:
        overrides = {**overrides, "parallel.layout": "ddp"}
        layout = "ddp"
    flags = ["--config", config_path, "--run.dir", run_dir, "--checkpoint.dir", checkpoint_dir]
    flags += override_flags(overrides)
    if resume:
        flags += ["--resume", resume]
    # the shim registers faulthandler on SIGUSR1 (stack dumps of hangs) and the
    # parent-death signal, then runs ``python -m trainer`` unchanged
    shim = ["-m", "orchestrator.supervisor.shim", "trainer", "train"]
    if layout == "ddp":
        how = rdzv.flags() if rdzv is not None else ["--standalone"]
        return [python, "-m", "torch.distributed.run", *how,
                f"--nproc_per_node={nproc}", *shim, *flags]
    return [python, *shim, *flags]


def group_env(node: int, extra: Mapping[str, str]) -> dict[str, str]:
    """What a multi-node attempt's env adds on one node: its index and the group's env
    (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, CUDA_VISIBLE_DEVICES; GroupSpec.env)."""
    return {**{str(k): str(v) for k, v in extra.items()}, envvars.NODE_RANK: str(int(node))}


# --- the supervisor's start command ---------------------------------------------------------

#: setsid mode: detach fully (own session, fds away from the SSH channel) and restart the
#: supervisor if it dies abnormally (it re-reads state.json and reaps orphans). Constant;
#: values come as positional parameters: $1 = log file, $2.. = the supervisor argv.
SETSID_SCRIPT = r'''log=$1; shift
exec </dev/null >>"$log" 2>&1
n=0
while :; do
  "$@"
  rc=$?
  [ "$rc" -eq 0 ] && exit 0
  n=$((n+1))
  [ "$n" -ge 5 ] && { echo "dfo: supervisor exited $rc; giving up after $n restarts"; exit "$rc"; }
  echo "dfo: supervisor exited $rc; restarting it ($n/5)"
  sleep 2
done'''


def unit_name(run_id: str) -> str:
    return f"dfo-{run_id}"


def supervisor_argv(python: str, run_dir: str) -> list[str]:
    return [python, "-m", "orchestrator.supervisor", "--run-dir", run_dir]


def start_argv(python: str, run_dir: str, run_id: str, *, systemd: bool,
               stop_timeout_s: float = 120.0) -> list[str]:
    """The argv that starts the supervisor detached (never ``cmd &`` over SSH)."""
    log = posixpath.join(run_dir, "supervisor.log")
    sup = supervisor_argv(python, run_dir)
    if systemd:
        return ["systemd-run", f"--unit={unit_name(run_id)}", "--collect", "--quiet",
                "--property=Restart=on-failure", "--property=RestartSec=2",
                f"--property=TimeoutStopSec={int(stop_timeout_s) + 30}",
                f"--property=StandardOutput=append:{log}",
                f"--property=StandardError=append:{log}",
                f"--working-directory={run_dir}",
                "--setenv=PYTHONUNBUFFERED=1", *sup]
    return ["setsid", "-f", "sh", "-c", SETSID_SCRIPT, "dfo-supervisor", log, *sup]


# --- the probe launch runs before anything else ----------------------------------------------

#: One round trip: init system, tools, env, and run.lock (``probes.launch_probe``).
PROBE_SCRIPT = LAUNCH_PROBE_SCRIPT
parse_probe = parse_launch_probe


def probe_argv(root: str, lock: str) -> list[str]:
    return list(launch_probe(root, lock).argv)


# --- the plan -------------------------------------------------------------------------------

@dataclass
class LaunchPlan:
    host: str
    run_id: str
    run_name: str
    run_dir: str
    mode: str                       # "systemd" | "setsid"
    start_argv: list[str]
    first_attempt_argv: list[str]
    env: dict[str, str]
    spec: dict[str, Any]
    ladders: dict[str, list[str]]
    resume_path: str | None
    warnings: list[str] = field(default_factory=list)
    #: what ``launch`` does on the host before it starts the supervisor (not in spec.json)
    seed_argvs: list[list[str]] = field(default_factory=list)   # seed the run's compile cache
    config_bytes: bytes = b""                                   # the run config file, shipped as is
    lock_owner: str | None = None                               # the live run --replace stops
    move_aside: str | None = None      # --new-lineage: where the earlier checkpoints go

    def to_json(self) -> dict:
        return {"host": self.host, "run_id": self.run_id, "run_name": self.run_name,
                "run_dir": self.run_dir, "mode": self.mode, "start_argv": self.start_argv,
                "first_attempt_argv": self.first_attempt_argv, "env": self.env,
                "ladders": self.ladders, "resume": self.resume_path, "warnings": self.warnings,
                "budget": self.spec.get("budget"), "thresholds": self.spec.get("thresholds"),
                "move_aside": self.move_aside, "standby": self.spec.get("standby", True)}


def build_spec(*, run_id: str, run_name: str, root: str, python: str, config_path: str,
               base_config: Mapping[str, Any], overrides: Mapping[str, Any],
               resume_path: str | None, checkpoint_dir: str, env: Mapping[str, str],
               fault: str | None, ladders: Mapping[str, list[str]], budget: Mapping[str, Any],
               thresholds_: Mapping[str, float], lock: str, restore_cache_argv: list[str] | None,
               host: str) -> dict:
    """spec.json: everything the supervisor needs, so it never re-reads hosts.yaml."""
    return {
        "version": 1, "run_id": run_id, "run_name": run_name, "root": root, "host": host,
        "python": python, "config_path": config_path, "base_config": dict(base_config),
        "overrides": dict(overrides), "resume": resume_path, "checkpoint_dir": checkpoint_dir,
        "env": dict(env), "fault": fault, "ladders": {k: list(v) for k, v in ladders.items()},
        "budget": dict(budget), "thresholds": dict(thresholds_), "lock": lock,
        "restore_cache_argv": restore_cache_argv,
    }


def attempt_env(base: Mapping[str, str], *, attempt: int, run_dir: str,
                fault: str | None, run_id: str | None = None) -> dict[str, str]:
    """The env of one attempt (docs/contracts.md); ``DFO_RUN_ID`` (checkpoint lineage) when
    ``run_id`` is given."""
    env = dict(base)
    env.update({"DFO_ATTEMPT": str(attempt), "DFO_RUN_DIR": run_dir, "PYTHONUNBUFFERED": "1",
                "NCCL_NVLS_ENABLE": "0"})
    if run_id:
        env[envvars.RUN_ID] = run_id
    if fault:
        env["DFO_FAULT"] = fault
    else:
        env.pop("DFO_FAULT", None)
    return env
