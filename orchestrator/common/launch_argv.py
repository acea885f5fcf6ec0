"""The argvs and env of a launch (pure): the trainer's argv of one attempt (bundled trainer,
ddp, one node of a multi-node run), the env of an attempt, and the argv that starts the
supervisor detached. ``dfo launch`` shows them; the supervisor builds each attempt's argv
and env with these same functions.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Mapping

from dfo_contract import envvars


def flatten(d: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (sections of fields) -> flat dotted keys."""
    out: dict[str, Any] = {}
    for sec, body in d.items():
        if isinstance(body, Mapping):
            for k, v in body.items():
                out[f"{sec}.{k}"] = v
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


# --- the attempt's trainer argv ------------------------------------------------------------

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
#: the supervisor's exit status when its run directory was deleted under it or is read-only:
#: the run is over and a restart could only fail (neither systemd nor the setsid script
#: restarts it)
RUN_DIR_UNUSABLE_EXIT = 3

#: values come as positional parameters: $1 = log file, $2.. = the supervisor argv.
SETSID_SCRIPT = r'''log=$1; shift
exec </dev/null >>"$log" 2>&1
n=0
while :; do
  "$@"
  rc=$?
  [ "$rc" -eq 0 ] && exit 0
  [ "$rc" -eq 3 ] && { echo "dfo: supervisor exited 3: its run directory is gone or read-only; not restarted"; exit 3; }
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
                f"--property=RestartPreventExitStatus={RUN_DIR_UNUSABLE_EXIT}",
                f"--property=TimeoutStopSec={int(stop_timeout_s) + 30}",
                f"--property=StandardOutput=append:{log}",
                f"--property=StandardError=append:{log}",
                f"--working-directory={run_dir}",
                "--setenv=PYTHONUNBUFFERED=1", *sup]
    return ["setsid", "-f", "sh", "-c", SETSID_SCRIPT, "dfo-supervisor", log, *sup]


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
