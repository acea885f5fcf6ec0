"""The layout protocol: what the training loop asks of a layout (``Layout``).

A layout owns the models and how one optimizer step's gradients are computed; the loop
(trainer.train.loop) owns the data stream, optimizer, schedule, metrics, checkpoints and signals.
Every layout implements the whole protocol; ``LayoutBase`` gives the hooks that most
layouts do not need their no-op defaults.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, runtime_checkable


@runtime_checkable
class Layout(Protocol):
    name: str
    is_main: bool          # this process reads/writes checkpoints, writes metrics (ddp: main_rank)
    data_parallel: int     # micro-batch streams per accumulation step (1 for single)
    device: Any            # the drafter's (replica 0's) device
    target: Any            # the (first) frozen target
    drafter: Any           # the module saved in checkpoints (unwrapped; replica 0)

    def parameters(self) -> Iterable:
        """The trainable parameters (the optimizer's)."""

    def warmup(self, emitter, heartbeat_s: float) -> list[dict]:
        """Compile every shape bucket before step 1; one record per warmed unit."""

    def micro_indices(self, n_micro: int) -> list[int]:
        """Which of a step's ``n_micro`` micro-batches this process builds (ddp: its rank's)."""

    def grads(self, batches: list, loss_hook: Callable | None = None) -> list[dict]:
        """Forward + backward of one step's micro-batches; grads left in ``.grad``.
        ddp: the entries not in ``micro_indices`` may be ``trainer.data.stream.SkippedBatch``."""

    def compiled_call(self) -> Callable[[], object] | None:
        """A zero-argument callable entering compiled code (fault injection's fx_race)."""

    def after_step(self) -> None:
        """After the optimizer step (threads: copy replica 0 into the others)."""

    def before_save(self) -> None:
        """Before a checkpoint is written, on every rank (replicas must be identical)."""

    def agree_stop(self, local: bool) -> bool:
        """Whether to stop now, agreed by every rank (ddp: any rank got a signal)."""

    def from_main(self, value):
        """The main rank's ``value`` on every rank (ddp: broadcast; others pass ``None``).
        Nested dicts/lists/tuples of tensors and plain values; tensors keep their device kind."""

    def close(self) -> None:
        """Release threads, process groups, the sealed gate."""


class LayoutBase:
    """No-op defaults of the optional hooks (one process, one replica)."""

    name = "base"
    is_main = True
    data_parallel = 1

    def micro_indices(self, n_micro: int) -> list[int]:
        return list(range(n_micro))

    def after_step(self) -> None:
        return None

    def before_save(self) -> None:
        return None

    def agree_stop(self, local: bool) -> bool:
        return local

    def from_main(self, value):
        return value

    def close(self) -> None:
        return None
