"""Checkpoints: save/load a training state as ``step_N/`` (manifest last), keep the last k.

``<checkpoint.dir>/step_N/`` holds ``drafter.safetensors`` (trainable weights only; the
shared embedding/LM head are the target's), ``optim.pt``, ``sched.pt``, ``rng.pt``,
``data.json`` (the data stream position), ``config.yaml`` and ``manifest.json`` with the
sha256 of each, written last. The directory is built as ``.step_N.tmp-<pid>`` and renamed;
re-saving an existing ``step_N`` swaps the two atomically (``renameat2(RENAME_EXCHANGE)``),
so there is no moment with neither. The manifest records the run and attempt (lineage), and
``prune`` given a run id deletes only that run's checkpoints.

``python -m trainer.core.checkpoints list DIR [--json] [--no-hash]`` is
``python -m dfo_contract.checkpoints list`` (torch-free; the manifests live there).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys

from dfo_contract import checkpoints as cm
from dfo_contract.exitcodes import CheckpointError
from dfo_contract.fsio import fsync_dir, replace_dir

from . import diskfull

log = logging.getLogger("dfo")


def rng_state() -> dict:
    import torch

    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    import torch

    torch.set_rng_state(st["torch"])
    py = st["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save(root: str, step: int, *, drafter, optimizer, scheduler, data_state: dict,
         config_yaml: str, keep: int | None = None, extra: dict | None = None,
         run_id: str | None = None, attempt: int | None = None) -> str:
    """Write ``root/step_<step>`` atomically; prune to the newest ``keep`` (of run ``run_id``
    when given). The manifest records ``run_id``/``attempt``. Returns its path. A save that
    runs out of space removes what it wrote and raises ``DiskFullError`` (trainer.core.diskfull)."""
    from safetensors.torch import save_file

    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step_{step}")
    tmp = os.path.join(root, f".step_{step}.tmp-{os.getpid()}")  # cm.TMP_RE
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    try:
        os.makedirs(tmp)
        sd = {k: v.detach().contiguous().cpu() for k, v in drafter.trainable_state_dict().items()}
        save_file(sd, os.path.join(tmp, "drafter.safetensors"),
                  metadata={"step": str(step), "format": "dfo-dflash-1"})
        diskfull.torch_save(optimizer.state_dict(), os.path.join(tmp, "optim.pt"))
        diskfull.torch_save(scheduler.state_dict(), os.path.join(tmp, "sched.pt"))
        diskfull.torch_save(rng_state(), os.path.join(tmp, "rng.pt"))
        with open(os.path.join(tmp, "data.json"), "w") as f:
            json.dump({"step": step, **data_state, **(extra or {})}, f, indent=1, sort_keys=True)
        with open(os.path.join(tmp, "config.yaml"), "w") as f:
            f.write(config_yaml)
        for name in cm.REQUIRED_FILES:
            with open(os.path.join(tmp, name), "rb+") as f:
                os.fsync(f.fileno())
        lineage = {"run": run_id, "attempt": attempt} if run_id else None
        cm.write_manifest(tmp, step, list(cm.REQUIRED_FILES), lineage=lineage)
        fsync_dir(tmp)
    except Exception as e:  # noqa: BLE001 - safetensors has its own error type
        if not diskfull.is_disk_full(e):
            raise
        raise diskfull.error(root, step, tmp, e) from None
    # re-saving a step (e.g. after a resume): swap, then drop the old
    replace_dir(tmp, final, old=os.path.join(root, f".step_{step}.old-{os.getpid()}"))
    if keep:
        prune(root, keep, run_id=run_id)
    return final


def prune(root: str, keep: int, *, run_id: str | None = None) -> list[str]:
    """Delete all but the newest ``keep`` valid checkpoints, torn ones older than those, and
    temp dirs of dead writers. Only ``step_N`` / ``.step_N.tmp-PID`` / ``.step_N.old-PID``
    names are touched. With ``run_id``, only checkpoints whose manifest says that run count
    and are deleted: another run's (or an unknown one's) are never touched."""
    removed = []
    infos = cm.list_checkpoints(root, check_hashes=False)
    if run_id is not None:
        infos = [c for c in infos if c.run == run_id]
    valid = [c for c in infos if c.valid]
    best = _best_name(root)
    if len(valid) > keep:
        floor = valid[keep - 1].step
        for c in infos:
            if c.step < floor and os.path.basename(c.path) != best:
                shutil.rmtree(c.path, ignore_errors=True)
                removed.append(c.path)
    for p in cm.stale_tmp_dirs(root):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _best_name(root: str) -> str | None:
    """The checkpoint ``<root>/best`` points to (the best measured acceptance length,
    trainer.evaluate.accept): pruning never deletes it."""
    try:
        with open(os.path.join(root, "best")) as f:
            name = json.load(f).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def read(path: str, *, device=None, rng: bool = True, optim: bool = True) -> dict:
    """Read a verified checkpoint into memory: ``{"path", "drafter", "optim", "sched", "rng",
    "data"}`` (tensors on the CPU, the optimizer's on ``device``). Under ddp only the main rank
    calls this; the layout shares the result with the others (``Layout.from_main``)."""
    import torch
    from safetensors.torch import load_file

    ok, why = cm.verify(path)
    if not ok:
        raise CheckpointError(f"checkpoint: {path} is not usable: {why}")
    with open(os.path.join(path, "data.json")) as f:
        data = json.load(f)
    return {"path": path, "drafter": load_file(os.path.join(path, "drafter.safetensors")),
            "optim": torch.load(os.path.join(path, "optim.pt"), map_location=device,
                                weights_only=True) if optim else None,
            "sched": torch.load(os.path.join(path, "sched.pt"), weights_only=True),
            "rng": torch.load(os.path.join(path, "rng.pt"), weights_only=True) if rng else None,
            "data": data}


def apply(state: dict, *, drafter, optimizer=None, scheduler=None,
          restore_rng: bool = True) -> dict:
    """Put a ``read`` state into the given objects; returns data.json's content."""
    path = state["path"]
    try:
        drafter.load_trainable_state_dict(state["drafter"])
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint: {path}: drafter weights do not fit this model ({e}); "
                              "resume with the config the checkpoint was made with") from None
    if optimizer is not None:
        optimizer.load_state_dict(state["optim"])
    if scheduler is not None:
        scheduler.load_state_dict(state["sched"])
    if restore_rng and state.get("rng") is not None:
        set_rng_state(state["rng"])
    return state["data"]


def load(path: str, *, drafter, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict:
    """Load a verified checkpoint into the given objects; returns data.json's content."""
    dev = next(iter(drafter.trainable_parameters())).device
    st = read(path, device=dev, rng=restore_rng, optim=optimizer is not None)
    return apply(st, drafter=drafter, optimizer=optimizer,
                 scheduler=scheduler, restore_rng=restore_rng)


# --------------------------------------------------------------------------- CLI (torch-free)

def main(argv: list[str] | None = None) -> int:
    """``list DIR [--json] [--no-hash]``: dfo_contract.checkpoints' command under this name."""
    return cm.main(argv, prog="python -m trainer.core.checkpoints")


if __name__ == "__main__":
    sys.exit(main())
