"""Fault injection pieces in-process: fx_race past a sealed gate, nan, slow, oom."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from trainer.telemetry import faults  # noqa: E402
from trainer.compile.gate import CompileGate, WarmupTask  # noqa: E402


@pytest.fixture(autouse=True)
def _clean():
    yield
    torch.compiler.set_stance("default")


@pytest.fixture
def inj() -> faults.Faults:
    """A process's fault injection state, fresh for each test."""
    return faults.Faults()


def test_fx_race_is_torchs_own_error_even_past_a_sealed_gate(inj):
    fn = torch.compile(lambda x: torch.cos(x) * 3, backend="eager", dynamic=False)
    x = torch.randn(4)
    gate = CompileGate(True, {"fail_on_recompile_limit_hit": True})
    gate.warmup([WarmupTask("cpu", (4,), lambda: fn(x))])
    gate.seal()
    for _ in range(3):  # reliably, not by luck
        with pytest.raises(RuntimeError) as ei:
            inj.maybe_inject(2, attempt=1, spec="fx_race@2",
                                compiled_call=lambda: gate.call(fn, x))
        assert faults.FX_RACE_TEXT in str(ei.value)
        tb = ei.traceback
        assert any("eval_frame.py" in str(e.path) for e in tb)  # raised inside torch
    # the tracer thread is gone and compiled code works again afterwards
    deadline = time.monotonic() + 60
    while any(t.name == "dfo-fault-fx-tracer" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the fx tracer thread is still alive"
        time.sleep(0.05)
    with gate.guard():
        fn(x)


def test_fx_race_without_compiled_code_uses_a_tiny_compiled_function():
    with pytest.raises(RuntimeError, match="symbolically trace a dynamo-optimized function"):
        faults.raise_fx_race(None)


def test_nothing_fires_on_other_steps_or_attempts(inj):
    assert inj.maybe_inject(1, attempt=1, spec="oom@2").fired == []
    assert inj.maybe_inject(2, attempt=2, spec="oom@2").fired == []
    assert inj.maybe_inject(2, attempt=1, spec=None).fired == []
    with pytest.raises(torch.OutOfMemoryError, match="fault injection oom@2"):
        inj.maybe_inject(2, attempt=1, spec="oom@2")


def test_nan_effect_poisons_the_loss_and_its_gradient(inj):
    eff = inj.maybe_inject(3, attempt=1, spec="nan@3")
    assert eff.nan and eff.fired == ["nan@3#1"]
    w = torch.ones(2, requires_grad=True)
    loss = eff.apply_to_loss((w * 2).sum())
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(w.grad).all()
    assert inj.maybe_inject(4, attempt=1, spec="nan@3").apply_to_loss(torch.tensor(1.0)) == 1.0


class FakeClock:
    """``time`` for trainer.telemetry.faults: perf_counter reads it, sleep and work advance it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_slow_stretches_each_step_to_one_over_f(capsys, monkeypatch, inj):
    clock = FakeClock()
    monkeypatch.setattr(faults, "time", clock)
    inj.maybe_inject(1, attempt=1, spec="slow=0.5@1")
    assert "materializes the full scores matrix" in capsys.readouterr().err
    assert clock.slept == []                    # the throttle starts with the next step
    t0 = clock.now
    clock.now += 0.1                            # a step's work
    inj.maybe_inject(2, attempt=1, spec="slow=0.5@1")
    took = clock.now - t0
    assert 0.19 <= took < 0.5  # work 0.1 s + throttle 0.1 s: half the throughput
    assert clock.slept == [pytest.approx(0.1)]
    clock.now += 0.3                            # a longer step is stretched as much
    inj.maybe_inject(3, attempt=1, spec="slow=0.5@1")
    assert clock.slept[1] == pytest.approx(0.3)
