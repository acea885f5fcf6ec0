"""``dfo export``: export a run's checkpoint as a servable drafter and bring it home.

On the host, with the deployed env's python: ``python -m trainer export CKPT --out
<root>/exports/<run-name>/step_N`` (z-lab/SGLang DFlash layout; it prints the files'
sha256 and sizes). Then each file is copied to the user's machine into a temporary
directory beside ``--to``, its sha256 checked against the host's, and the directory renamed
into place: ``--to`` either holds the complete, verified export or is untouched.

``--step``: ``N`` (step_N), ``best`` (the run's ``best`` pointer: highest measured
acceptance length) or, by default, the newest valid checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dfo_contract.checkpoints import CkptInfo
from dfo_contract.cache_records import FileDigest
from dfo_contract.codec import encode
from dfo_contract.errors import ContractError
from dfo_contract.replies import BestCheckpoint, CheckpointListing, ExportReply
from dfo_contract.fsio import human_bytes, replace_dir, sha256_file
from dfo_contract.trainer_config.layers import parse_engines

from ..common.errors import ConfigError, NotFoundError, RemoteCommandError, VerifyError
from ..plan.probes import json_reply
from .runs import RunOps

log = logging.getLogger("dfo")

_STEP = re.compile(r"^(best|latest|\d+)$")


@dataclass(frozen=True)
class ExportResult:
    run_id: str
    checkpoint: str          # host path of the exported checkpoint
    remote_dir: str          # host path of the export
    local_dir: str
    step: int
    accept_len: float | None
    files: dict[str, FileDigest]     # every file written but dfo_export.json
    target_precision: str = "full"   # the target the features came from: full | fp8

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "checkpoint": self.checkpoint, "remote_dir": self.remote_dir,
                "local_dir": self.local_dir, "step": self.step, "accept_len": self.accept_len,
                "target_precision": self.target_precision, "files": encode(self.files)}


def parse_step(step: str | None) -> str:
    s = (step or "latest").strip()
    if not _STEP.match(s):
        raise ConfigError(f"--step {step!r} is not a step", hint="use a number, best or latest")
    return s


class ExportOps:
    def __init__(self, transport, host, *, say: Callable[[str], None] | None = None):
        self.transport = transport
        self.host = host
        self.tree = host.tree
        self.runs = RunOps(transport, host, say=say)
        self.say = say or (lambda m: log.info("%s", m))

    def _checkpoints(self, ck_dir: str, run_id: str) -> tuple[str | None, list[CkptInfo], list[str]]:
        """(the directory that holds run ``run_id``'s checkpoints: ``ck_dir`` or the copy a
        later ``--new-lineage`` moved them aside to, None when neither; that run's
        checkpoints there, their weights hashed against their manifests (an export is where
        a checkpoint is used: it is verified here); the runs whose checkpoints ``ck_dir``
        holds)."""
        r = self.transport.run([self.runs.python, "-m", "dfo_contract.checkpoints", "list", ck_dir,
                        "--json", "--no-promote", "--run", run_id], timeout=600)
        if not r.ok:
            if "does not exist" in r.err or "No such file" in r.err or r.exit_code == 4:
                return None, [], []
            r.check("listing checkpoints")
        try:
            got = CheckpointListing.from_json(json.loads(r.out or "{}"))
        except ContractError as e:     # JSON, but not a listing
            raise RemoteCommandError(f"listing checkpoints in {ck_dir}: {e}") from None
        except ValueError:
            raise RemoteCommandError(f"listing checkpoints in {ck_dir}: output is not JSON") \
                from None
        return got.dir, got.oldest_first(), got.runs_in_dir

    def _checkpoint(self, ck_dir: str, run_id: str, step: str) -> str:
        where, infos, others = self._checkpoints(ck_dir, run_id)
        if where is None:
            held = f" ({ck_dir} holds run {', '.join(others)}'s)" if others else ""
            raise NotFoundError(f"run {run_id} has no checkpoint in {ck_dir} nor in a copy "
                                f"moved aside from it{held}",
                                hint="see `dfo status` for the runs and their checkpoints")
        valid = [c for c in infos if c.valid]
        for c in sorted(infos, key=lambda c: c.step, reverse=True):
            if c.valid:
                break
            if step == "latest":
                log.warning("checkpoint %s skipped: %s", c.path, c.reason or "does not verify")
        if step == "best":
            best_path = posixpath.join(where, "best")
            try:
                best = BestCheckpoint.from_json(json.loads(self.transport.get(best_path)))
            except NotFoundError:
                raise NotFoundError(f"no best checkpoint recorded in {where}",
                                    hint="train with --set eval.every=N and data.eval_path, "
                                         "or pass --step N") from None
            except (ValueError, ContractError) as e:
                raise NotFoundError(f"the best checkpoint's record {best_path} cannot be read "
                                    f"({e})", hint="pass --step N (see `dfo status`)") from None
            step = str(best.step)
        if step == "latest":
            if not valid:
                raise NotFoundError(f"no valid checkpoint of run {run_id} in {where}",
                                    hint="see `dfo status`")
            return max(valid, key=lambda c: c.step).path
        for c in valid:
            if c.step == int(step):
                return c.path
        have = ", ".join(str(c.step) for c in sorted(valid, key=lambda c: c.step)) or "none"
        raise NotFoundError(f"no valid checkpoint step_{int(step)} of run {run_id} in {where}",
                            hint=f"valid steps: {have}")

    def export(self, to: str, *, run: str | None = None, step: str | None = None,
               dtype: str = "bf16", progress: Callable[[str, int, int], None] | None = None,
               engines: str = "all") -> ExportResult:
        st = parse_step(step)
        try:
            parse_engines(engines)
        except ValueError as e:
            raise ConfigError(f"--engines {engines}: {e}",
                              hint="give a comma-separated list of those engines") from None
        if dtype not in ("bf16", "fp16", "fp32"):
            raise ConfigError(f"--dtype {dtype!r}", hint="use bf16, fp16 or fp32")
        dest = Path(to).expanduser().resolve()
        if dest.exists() and any(dest.iterdir()) and not (dest / "dfo_export.json").exists():
            raise ConfigError(f"--to {dest} exists and is not a dfo export",
                              hint="give a new or empty directory")
        run_id = self.runs.current_run(run)
        info = self.runs.one(run_id)
        name = info.state.run_name or run_id
        ck_dir = self.tree.checkpoints(name)
        ckpt = self._checkpoint(ck_dir, run_id, st)
        remote = posixpath.join(self.tree.root, "exports", name, posixpath.basename(ckpt))
        self.say(f"exporting {ckpt} on {self.host.name}")
        r = self.transport.run([self.runs.python, "-m", "trainer", "export", ckpt, "--out", remote,
                        "--dtype", dtype, "--engines", engines], timeout=1800)
        if not r.ok:
            last = (r.err.strip().splitlines() or ["(no output)"])[-1]
            raise RemoteCommandError(f"export of {ckpt} failed on {self.host.name}: {last}",
                                     exit_status=r.exit_code)
        try:
            man = ExportReply.from_json(json_reply(r.out, "exporting the drafter"))
        except ContractError as e:
            raise RemoteCommandError(f"export of {ckpt} on {self.host.name}: {e}") from None
        files = man.files
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
        except OSError as e:
            raise ConfigError(f"--to {dest}: cannot create it here ({e.strerror or e})",
                              hint="give a directory you can write to") from None
        total = sum(m.size for m in files.values())
        done = 0
        fname = dest.name
        try:
            for fname in [*sorted(files), "dfo_export.json"]:
                local = tmp / fname
                self.transport.get_file(posixpath.join(remote, fname), local)
                if fname in files:
                    got = sha256_file(local)
                    if got != files[fname].sha256:
                        raise VerifyError(f"{fname}: sha256 {got[:12]} here, "
                                          f"{files[fname].sha256[:12]} on {self.host.name}",
                                          hint="run dfo export again")
                    done += files[fname].size
                if progress:
                    progress(fname, done, total)
            replace_dir(tmp, dest)
        except OSError as e:
            raise ConfigError(f"--to {dest}: cannot write {e.filename or fname}: "
                              f"{e.strerror or e}",
                              hint=f"free {human_bytes(total)} there or give another directory") \
                from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ExportResult(run_id=run_id, checkpoint=ckpt, remote_dir=remote, local_dir=str(dest),
                            step=man.step, accept_len=man.accept_len, files=files,
                            target_precision=man.target_precision or "full")

