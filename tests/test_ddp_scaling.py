"""ddp scaling: ranks build only their own micro-batches, the metrics of a
step travel in one collective, DDP's settings are config, and bench/bench_ddp.py runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.trainer import REPO, make_synth, make_target  # noqa: E402
from dfo_contract.exitcodes import TrainerConfigError  # noqa: E402
from dfo_contract.trainer_config import load_config  # noqa: E402
from trainer.data.datasets import open_dataset  # noqa: E402
from trainer.data.stream import BatchStream, SkippedBatch  # noqa: E402
from trainer.parallel.ddp import my_indices, pack_metrics, unpack_metrics  # noqa: E402

B = 8
KW = dict(micro_batch=3, block_size=B, num_anchors=6, seq_buckets=[32, 64], anchor_buckets=[4, 8],
          seed=5)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp-data")
    path = make_synth(str(d / "data.jsonl"), num=11, seq_len=60, seed=3)
    return d, path


def _open(path):
    return open_dataset(path, vocab_size=128, block_size=B, max_seq_len=48, min_loss_tokens=1)


def _same(a, b):
    return (a.input_ids.equal(b.input_ids) and a.loss_mask.equal(b.loss_mask)
            and a.anchors.equal(b.anchors) and a.anchor_valid.equal(b.anchor_valid)
            and a.num_tokens == b.num_tokens and a.num_samples == b.num_samples)


def _rank_batches_equal_single(ds, world, steps=4, accum=2):
    n = world * accum
    single = BatchStream(ds, **KW)
    want = [[single.next() for _ in range(n)] for _ in range(steps)]
    for rank in range(world):
        s = BatchStream(ds, **KW)
        mine = my_indices(n, rank, world)
        for st in range(steps):
            got = s.take(n, keep=mine)
            for i, b in enumerate(got):
                if i in mine:
                    assert _same(b, want[st][i]), (rank, st, i)
                else:  # another rank's: only counted, with the single loop's figures
                    assert isinstance(b, SkippedBatch)
                    assert (b.num_tokens, b.num_samples) == (want[st][i].num_tokens,
                                                             want[st][i].num_samples)
        assert s.state_dict() == single.state_dict()


@pytest.mark.parametrize("world", [2, 3])
def test_rank_batches_equal_the_single_loops_at_its_indices(data, world):
    _rank_batches_equal_single(_open(data[1]), world)


def test_rank_batches_equal_single_on_a_tokenized_store(data):
    d, path = data
    target = make_target(str(d / "target"))
    out = str(d / "store")
    r = subprocess.run([sys.executable, "-m", "trainer.data", "tokenize", "--target", target,
                        "--in", path, "--out", out], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    ds = _open(out)
    assert getattr(ds, "store", None) is not None
    _rank_batches_equal_single(ds, 2)


def test_skipping_builds_nothing_for_other_ranks(data, monkeypatch):
    import trainer.data.stream as D

    built = []
    real = D.collate
    monkeypatch.setattr(D, "collate", lambda samples, **kw: built.append(kw["micro_index"])
                        or real(samples, **kw))
    s = BatchStream(_open(data[1]), **KW)
    for _ in range(3):
        s.take(8, keep=my_indices(8, 1, 4))
    assert built == [1, 5, 9, 13, 17, 21]


def test_resume_mid_run_gives_each_rank_the_same_batches(data):
    ds = _open(data[1])
    n, mine = 4, my_indices(4, 1, 2)
    a = BatchStream(ds, **KW)
    for _ in range(3):
        a.take(n, keep=mine)
    st = json.loads(json.dumps(a.state_dict()))
    b = BatchStream(ds, **KW)
    b.load_state_dict(st)
    for x, y in zip(a.take(n, keep=mine), b.take(n, keep=mine), strict=True):
        assert type(x) is type(y)
        assert _same(x, y) if not isinstance(x, SkippedBatch) else x == y


def _metrics(seed):
    g = torch.Generator().manual_seed(seed)
    return {"loss": torch.rand((), generator=g),
            "correct_per_pos": torch.randint(0, 9, (B - 1,), generator=g).float(),
            "count_per_pos": torch.randint(9, 20, (B - 1,), generator=g).float(),
            "n": torch.tensor(7, dtype=torch.int64)}


def test_packed_metrics_round_trip():
    local = [_metrics(i) for i in range(3)]
    flat = pack_metrics(local)
    assert flat.dim() == 1 and flat.dtype == torch.float32 and flat.numel() == 3 * (1 + 2 * 7 + 1)
    back = unpack_metrics(flat, local)
    for m, b in zip(local, back, strict=True):
        assert sorted(m) == sorted(b)
        for k in m:
            assert b[k].dtype == m[k].dtype and b[k].shape == m[k].shape and b[k].equal(m[k])


def test_gather_is_one_collective_in_the_single_loops_order(monkeypatch):
    import torch.distributed as dist

    from trainer.parallel.ddp import DdpLayout

    world = 3
    per_rank = {r: [_metrics(10 * r + k) for k in range(2)] for r in range(world)}
    calls = []

    def fake_all_gather(bufs, t, **_):
        calls.append(t.numel())
        for r, buf in enumerate(bufs):
            buf.copy_(pack_metrics(per_rank[r]))

    monkeypatch.setattr(dist, "all_gather", fake_all_gather)
    lay = DdpLayout.__new__(DdpLayout)
    lay.rank, lay.world = 1, world
    out = lay._gather(per_rank[1], 2 * world)
    assert len(calls) == 1
    for r in range(world):
        for k, i in enumerate(my_indices(2 * world, r, world)):
            for key, v in per_rank[r][k].items():
                assert out[i][key].equal(v), (r, k, key)


def test_ddp_settings_are_validated_config():
    cfg = load_config(None, ["--data.path", "x", "--parallel.ddp_bucket_mb", "50",
                             "--parallel.ddp_grad_dtype", "bf16"])
    assert cfg.parallel.ddp_bucket_mb == 50 and cfg.parallel.ddp_grad_dtype == "bf16"
    assert load_config(None, ["--data.path", "x"]).parallel.ddp_grad_dtype == "fp32"
    with pytest.raises(TrainerConfigError, match="--parallel.ddp_grad_dtype: expected one of"):
        load_config(None, ["--data.path", "x", "--parallel.ddp_grad_dtype", "fp16"])
    with pytest.raises(TrainerConfigError, match="--parallel.ddp_bucket_mb"):
        load_config(None, ["--data.path", "x", "--parallel.ddp_bucket_mb", "0"])
    with pytest.raises(TrainerConfigError, match="--parallel.ddp_grad_dtype: bf16 .* use fp32"):
        load_config(None, ["--data.path", "x", "--parallel.layout", "ddp",
                           "--parallel.drafter_devices", "[cpu]",
                           "--parallel.ddp_grad_dtype", "bf16"])


def test_bf16_gradients_on_cpu_are_a_config_error():
    from trainer.parallel.ddp import DdpLayout

    lay = DdpLayout.__new__(DdpLayout)
    lay.device = torch.device("cpu")
    with pytest.raises(TrainerConfigError, match="--parallel.ddp_grad_dtype: bf16 .* use fp32"):
        lay.wrap(25, "bf16")


def test_bench_efficiency_is_relative_to_world_one_of_the_same_setting():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    from bench_ddp import efficiency

    rows = [{"world": w, "accum": acc, "grad_dtype": "fp32", "bucket_mb": 25,
             "samples_per_s": sps} for w, acc, sps in
            [(1, 1, 10.0), (2, 1, 18.0), (4, 1, 30.0), (1, 4, 11.0), (2, 4, 22.0)]]
    got = {(r["world"], r["accum"]): r["efficiency"] for r in efficiency(rows)}
    assert got == {(1, 1): 1.0, (2, 1): 0.9, (4, 1): 0.75, (1, 4): 1.0, (2, 4): 1.0}


def test_bench_cpu_smoke_runs_worlds_one_and_two(tmp_path):
    out = tmp_path / "ddp.json"
    r = subprocess.run([sys.executable, "bench/bench_ddp.py", "--cpu-smoke", "--worlds", "1,2",
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "world accum grads bucket    s/step  samples/s efficiency" in r.stdout
    summary = json.loads(out.read_text())
    rows = {(x["world"], x["accum"]): x for x in summary["rows"]}
    assert set(rows) == {(1, 1), (2, 1), (1, 4), (2, 4)}
    assert rows[(1, 1)]["efficiency"] == 1.0 and rows[(1, 4)]["efficiency"] == 1.0
    for (w, acc), x in rows.items():
        assert x["s_per_step"] > 0 and x["efficiency"] > 0
        assert x["samples_per_s"] == pytest.approx(w * acc / x["s_per_step"], rel=1e-3)
    assert [x["rc"] for x in summary["runs"]] == [0, 0]
    assert summary["shape"]["seq_len"] == 64 and summary["cpu_smoke"] is True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("compiled", [False, True])
def test_no_sync_holds_across_accumulation(monkeypatch, compiled):
    """One all-reduce per bucket per optimizer step, whatever the accumulation (with the
    drafter step compiled too): no_sync keeps the earlier micro-batches local."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from dfo_contract.trainer_config import TrainerConfig
    from trainer.core import step as S
    from trainer.parallel.ddp import DdpLayout
    from trainer.model.target import target_from_config, tiny_qwen3_config

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port()), "GLOO_SOCKET_IFNAME": "lo"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DFO_NODE_RANK", raising=False)
    cfg = TrainerConfig()
    cfg.parallel.layout, cfg.parallel.drafter_devices = "ddp", ["cpu"]
    cfg.model.drafter_layers, cfg.model.block_size, cfg.model.mask_token_id = 1, 8, 3
    cfg.model.attention, cfg.compile.enabled, cfg.compile.gate = "sdpa", compiled, False
    cfg.data.path, cfg.data.max_seq_len, cfg.data.num_anchors = "<test>", 32, 4
    lay = DdpLayout(cfg, build_target=lambda dev: target_from_config(
        tiny_qwen3_config(), device=dev, dtype=torch.float32, num_drafter_layers=1))
    try:
        calls = []

        def counting(state, bucket):
            calls.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        lay.ddp.register_comm_hook(None, counting)
        per_step = {}
        for accum in (1, 3):
            batches = [S.dummy_batch(cfg, 32, 4, 1, "cpu", seed=i) for i in range(accum)]
            calls.clear()
            out = lay.grads(batches)
            assert len(out) == accum and all(p.grad is not None for p in lay.parameters())
            per_step[accum] = sorted(calls)
            got = [p.grad.clone() for p in lay.parameters()]
            lay.drafter.zero_grad(set_to_none=True)
            for b in batches:  # the same accumulation without DDP: the mean gradient
                loss, _ = S.drafter_loss(lay.drafter, S.target_features(lay.target, b, cfg), b, cfg,
                                         lay.rt)
                (loss / accum).backward()
            want = [p.grad.clone() for p in lay.parameters()]
            lay.drafter.zero_grad(set_to_none=True)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
        assert per_step[1] and per_step[3] == per_step[1]
    finally:
        lay.close()
    assert not dist.is_initialized()


@pytest.mark.slow
def test_two_ranks_tear_down_their_gloo_group_without_an_abort(tmp_path):
    """Both ranks of a world-2 run close the layout, three runs in a row: none aborts in
    gloo's teardown ("terminate called without an active exception": a rank destroying
    the group while its peer's gloo threads still use it)."""
    for i in range(3):
        r = subprocess.run([sys.executable, "bench/bench_ddp.py", "--cpu-smoke", "--worlds", "2",
                            "--out", str(tmp_path / f"ddp{i}.json")], cwd=REPO,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": REPO})
        assert "terminate called" not in r.stderr and r.returncode == 0, r.stderr[-3000:]
        assert [x["rc"] for x in json.loads((tmp_path / f"ddp{i}.json").read_text())["runs"]] == [0]
