"""single, threads and ddp give the same loss curve on the same data and global batch (CPU)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("torch")

from tests.helpers.trainer import PY, REPO, make_synth, make_target, markers, run_trainer, \
    tiny_overrides  # noqa: E402
from dfo_contract.trainer_config import load_config  # noqa: E402
from trainer.parallel.ddp import my_indices, rank_device  # noqa: E402

STEPS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("layouts")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=48), d


def _args(tiny, run_dir, **extra):
    target, data, _ = tiny
    kw = {"train.max_steps": STEPS, "train.micro_batch": 4, "checkpoint.every": 2,
          "checkpoint.keep": 5}
    kw.update(extra)
    return ["train", *tiny_overrides(target, data, str(run_dir), **kw)]


def _losses(stdout: str) -> list[float]:
    return [m["loss"] for m in markers(stdout) if m["kind"] == "step"]


def test_pure_rank_helpers():
    assert my_indices(6, 0, 2) == [0, 2, 4] and my_indices(6, 1, 2) == [1, 3, 5]
    assert my_indices(3, 2, 3) == [2]
    cfg = load_config(None, ["--data.path", "x", "--parallel.drafter_devices", "[cpu]"])
    assert rank_device(cfg, 3, cuda_available=True) == "cpu"
    cfg = load_config(None, ["--data.path", "x", "--parallel.drafter_devices", "[cuda:0]"])
    assert rank_device(cfg, 3, cuda_available=True) == "cuda:3"


PACKED = {"data.pack": "true", "data.pack_tokens": 128, "data.pack_anchors": 16}


@pytest.mark.parametrize("packed", [False, True], ids=["bucketed", "packed"])
def test_threads_and_ddp_match_single(tiny, tmp_path, packed):
    """Each layout builds its own micro-batches of the one stream (ddp: a rank packs and
    builds only its own, planning the others'), so the loss curves agree."""
    extra = PACKED if packed else {}
    single = run_trainer(_args(tiny, tmp_path / "single", **{"train.grad_accum": 2, **extra}))
    assert single.returncode == 0, single.stderr[-2000:]
    want = _losses(single.stdout)
    assert len(want) == STEPS and want[-1] < want[0]

    threads = run_trainer(_args(tiny, tmp_path / "threads", **{
        "parallel.layout": "threads", "parallel.target_devices": "[cpu,cpu]",
        "parallel.drafter_devices": "[cpu,cpu]", **extra}))
    assert threads.returncode == 0, threads.stderr[-2000:]
    assert _losses(threads.stdout) == pytest.approx(want, rel=1e-5, abs=1e-6)

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env.pop("DFO_FAULT", None)
    run_dir = tmp_path / "ddp"
    ddp = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
         "-m", "trainer", *_args(tiny, run_dir, **{"parallel.layout": "ddp", **extra})],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert _losses(ddp.stdout) == pytest.approx(want, rel=1e-5, abs=1e-6)
    # only rank 0 wrote metrics and checkpoints
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, STEPS + 1))
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step_2", "step_4"]
    assert sum(1 for m in markers(ddp.stdout) if m["kind"] == "done") == 1


def test_ddp_outside_torchrun_is_a_config_error(tiny, tmp_path):
    r = run_trainer(_args(tiny, tmp_path / "x", **{"parallel.layout": "ddp"}))
    assert r.returncode == 2
    assert "ddp must be started by torchrun" in r.stderr and "Traceback" not in r.stderr


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    r = env.get(b"RANK")
    return int(r) if r is not None else None


def test_ddp_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(tiny, tmp_path):
    import signal

    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env.pop("DFO_FAULT", None)
    run_dir = tmp_path / "ddp-term"
    p = subprocess.Popen(
        [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
         "-m", "trainer", *_args(tiny, run_dir, **{"parallel.layout": "ddp",
                                                   "train.max_steps": 500,
                                                   "checkpoint.every": 0})],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith("@dfo ") and json.loads(line[5:]).get("step") == 3:
                break
        rank1 = [c for c in _children(p.pid) if _rank_of(c) == 1]
        assert rank1, "rank 1 not found"
        os.kill(rank1[0], signal.SIGTERM)  # only rank 1 is told to stop
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    ckpts = os.listdir(run_dir / "checkpoints")
    assert len(ckpts) == 1, (ckpts, err[-2000:])
    step = int(ckpts[0].split("_")[1])
    assert 3 <= step < 500
    assert f"interrupted by SIGTERM at step {step}" in out  # rank 0 saw the vote, same step
    assert "exitcode  : 6" in err, err[-2000:]  # torchrun's failure summary names exit 6
