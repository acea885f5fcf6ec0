"""The threads engine and replica helpers with small real torch models (CPU)."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from trainer.compile.gate import CompileGate, WarmupTask  # noqa: E402
from trainer.parallel import replicas  # noqa: E402
from trainer.parallel.workers import StepFns, ThreadedEngine  # noqa: E402


class Target(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(6, 5)
        self.requires_grad_(False)

    def forward(self, x):
        return torch.tanh(self.l(x))


class Drafter(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a = torch.nn.Linear(5, 7)
        self.b = torch.nn.Linear(7, 1)

    def forward(self, f):
        return self.b(torch.relu(self.a(f)))


def _fns(compiled=None):
    def loss(d, f, batch):
        x, y = batch
        out = d(f) if compiled is None else compiled(d, f)
        lv = ((out.squeeze(-1) - y) ** 2).mean()
        return lv, {"mse": lv.detach()}
    return StepFns(target_features=lambda t, b: t(b[0]), drafter_loss=loss,
                   to_device=lambda b, dev: tuple(x.to(dev) for x in b))


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(3, 6, generator=g), torch.randn(3, generator=g)) for _ in range(n)]


def _sequential_grads(batches, grad_accum):
    tgt, d = Target(), Drafter(seed=5)
    fns = _fns()
    for b in batches:
        with torch.no_grad():
            f = fns.target_features(tgt, b)
        lv, _ = fns.drafter_loss(d, f, b)
        (lv / len(batches)).backward()
    return [p.grad.clone() for p in d.parameters()]


@pytest.mark.parametrize("n_targets, n_drafters, grad_accum", [(1, 3, 1), (2, 3, 2), (1, 1, 3)])
def test_threads_average_equals_one_big_batch(n_targets, n_drafters, grad_accum):
    drafters = [Drafter(seed=5 + r) for r in range(n_drafters)]
    replicas.broadcast_params(drafters)  # replicas start identical whatever their init
    gate = CompileGate(enabled=False)
    eng = ThreadedEngine(targets=[("cpu", Target()) for _ in range(n_targets)],
                         drafters=[("cpu", d) for d in drafters], fns=_fns(), gate=gate,
                         grad_accum=grad_accum, queue_depth=1)
    batches = _batches(n_drafters * grad_accum)
    with eng:
        res = eng.run_step(batches)
    assert [r.index for r in res] == list(range(len(batches)))
    assert [r.replica for r in res] == [i % n_drafters for i in range(len(batches))]
    replicas.average_grads(drafters)
    want = _sequential_grads(batches, grad_accum)
    for d in drafters:
        for g, w in zip((p.grad for p in d.parameters()), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    replicas.check_equal(drafters)


def test_replicas_stay_identical_over_steps_and_divergence_is_named():
    drafters = [Drafter(seed=5 + r) for r in range(3)]
    replicas.broadcast_params(drafters)
    opts = [torch.optim.AdamW(d.parameters(), lr=1e-2) for d in drafters]
    eng = ThreadedEngine(targets=[("cpu", Target())], drafters=[("cpu", d) for d in drafters],
                         fns=_fns(), gate=CompileGate(enabled=False), grad_accum=1)
    with eng:
        for s in range(4):
            eng.run_step(_batches(3, seed=s))
            replicas.average_grads(drafters)
            for o in opts:
                o.step()
                o.zero_grad()
    replicas.check_equal(drafters)
    with torch.no_grad():
        drafters[2].b.bias.add_(1e-3)
    with pytest.raises(replicas.ReplicaDivergence, match=r"replica 2: parameter b.bias differs"):
        replicas.check_equal(drafters)


def test_worker_error_is_reraised_in_the_caller_with_its_text(capsys):
    fns = _fns()

    def bad_loss(d, f, b):
        raise torch.OutOfMemoryError("boom from a worker")
    fns.drafter_loss = bad_loss
    eng = ThreadedEngine(targets=[("cpu", Target())], drafters=[("cpu", Drafter(1))] * 2,
                         fns=fns, gate=CompileGate(enabled=False), grad_accum=1)
    with eng, pytest.raises(torch.OutOfMemoryError, match="boom from a worker"):
        eng.run_step(_batches(2))
    err = capsys.readouterr().err
    assert "Exception in thread drafter-" in err and "boom from a worker" in err


def test_gate_on_compiled_drafters_threads_repeated_no_error():
    """3 drafter threads calling one compiled function after warm-up, repeated."""
    def core(d, f):
        return d(f)
    compiled = torch.compile(core, backend="eager", dynamic=False)
    drafters = [Drafter(seed=5) for _ in range(3)]
    gate = CompileGate(True, {"recompile_limit": 8, "fail_on_recompile_limit_hit": True})
    fns = _fns(compiled=lambda d, f: gate.call(compiled, d, f))
    tgt = Target()

    def warm(d):
        def run():
            b = _batches(1)[0]
            lv, _ = fns.drafter_loss(d, fns.target_features(tgt, b).detach(), b)
            lv.backward()
            d.zero_grad()
        return run
    gate.warmup([WarmupTask("cpu", (3, 6), warm(d)) for d in drafters])
    gate.seal()
    try:
        for rep in range(5):
            eng = ThreadedEngine(targets=[("cpu", tgt)], drafters=[("cpu", d) for d in drafters],
                                 fns=fns, gate=gate, grad_accum=2)
            with eng:
                for s in range(3):
                    eng.run_step(_batches(6, seed=rep * 10 + s))
    finally:
        gate.unseal()
