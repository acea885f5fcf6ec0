"""The compile gate against small real compiled functions (torch 2.13 CPU, eager backend)."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from trainer.compile import gate as gate_mod  # noqa: E402
from trainer.compile.gate import CompileGate, RecompileAfterWarmup, WarmupTask  # noqa: E402


@pytest.fixture(autouse=True)
def _default_stance():
    yield
    torch.compiler.set_stance("default")


def _fresh_fn():
    def body(x, w):
        return (torch.tanh(x @ w) * 2).sum()
    return torch.compile(body, backend="eager", dynamic=False)


def _task(fn, shape, device="cpu"):
    def run():
        x = torch.randn(*shape)
        w = torch.randn(shape[-1], 4, requires_grad=True)
        fn(x, w).backward()
    return WarmupTask(device=device, shape=shape, run=run)


def test_dynamo_settings_are_per_thread_and_thread_setup_applies_them():
    import torch._dynamo.config as dcfg

    g = CompileGate(True, {"recompile_limit": 37, "fail_on_recompile_limit_hit": True})
    seen = {}

    def plain():
        seen["plain"] = dcfg.recompile_limit

    def setup():
        g.thread_setup()
        seen["setup"] = (dcfg.recompile_limit, dcfg.fail_on_recompile_limit_hit)

    g.thread_setup()  # in the main thread
    assert dcfg.recompile_limit == 37
    for f in (plain, setup):
        t = threading.Thread(target=f)
        t.start()
        t.join()
    # torch >= 2.12: a new thread does not see the main thread's write; thread_setup fixes it
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 12):
        assert seen["plain"] == 8
    assert seen["setup"] == (37, True)
    dcfg.recompile_limit = 8
    dcfg.fail_on_recompile_limit_hit = False


def test_warmup_then_new_shape_is_a_clear_error_naming_the_shape():
    fn = _fresh_fn()
    g = CompileGate(True, gate_mod.default_dynamo_settings(2))
    recs = g.warmup([_task(fn, (4, 8)), _task(fn, (6, 8))])
    assert [r.shape for r in recs] == [[4, 8], [6, 8]]
    assert all(r.seconds >= 0 for r in recs)
    assert "fxgraph_cache_hit" in recs[0].counters
    g.seal()
    # warmed shapes run fine, under the lock
    with g.guard():
        fn(torch.randn(4, 8), torch.randn(8, 4, requires_grad=True)).backward()
    g.check_shape("cpu", (4, 8))
    with pytest.raises(RecompileAfterWarmup) as ei:
        g.check_shape("cpu", (5, 8))
    assert "shape (seq_len=5, anchors=8) on cpu was not warmed up" in str(ei.value)
    # a shape that slips past check_shape: torch's stance refuses the compile, we name it
    x, w = torch.randn(5, 8), torch.randn(8, 4, requires_grad=True)
    with pytest.raises(RecompileAfterWarmup) as ei:
        g.call(fn, x, w, what="toy")
    msg = str(ei.value)
    assert "toy needed a compile after warm-up" in msg
    assert "(5, 8), (8, 4)" in msg
    assert "size mismatch" in msg and "\n" not in msg


def test_gate_off_is_the_unguarded_pattern():
    fn = _fresh_fn()
    g = CompileGate(False)
    g.seal()  # no-op when disabled
    assert not g.sealed
    # compiles lazily on first use, no stance, no lock
    with g.guard():
        fn(torch.randn(3, 8), torch.randn(8, 4))
    assert not g._lock._is_owned()


def test_guard_is_a_process_wide_lock_after_seal():
    g = CompileGate(True)
    g.warmup([])
    g.seal()
    inside = []
    peak = []

    def worker():
        g.thread_setup()
        for _ in range(20):
            with g.guard():
                inside.append(1)
                peak.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    ts = [threading.Thread(target=worker) for _ in range(3)]
    with g.guard():          # held while the workers start: they contend for certain
        for t in ts:
            t.start()
        deadline = time.monotonic() + 60
        while g.waits == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in ts:
        t.join()
    assert max(peak) == 1
    assert g.waits > 0  # the threads really contended
    with g.guard():
        with g.guard():  # re-entrant: a compiled call inside a guarded backward
            pass
