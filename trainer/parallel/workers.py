"""The ``threads`` layout's engine: one worker thread per device, bounded queues between them.

    target workers (T)  --features-->  drafter workers (D, one replica each)

Per optimizer step the caller hands ``run_step`` a list of ``D * grad_accum`` micro-batches.
Micro-batch ``i`` goes to target worker ``i % T`` and to drafter replica ``i % D``; each
drafter worker runs forward + backward on its micro-batches (loss divided by
``grad_accum``) and reports back. Queues are bounded (``queue_depth``), so a slow drafter
throttles the targets instead of piling features up in memory.

Every worker thread first calls ``gate.thread_setup()`` (dynamo settings are per-thread on
torch >= 2.12). With the gate sealed, every compiled call runs under the gate's process-wide
lock (trainer.compile.registry's call guard) and so does each backward through compiled graphs.

A worker's exception is printed like Python prints an uncaught thread exception
(``Exception in thread drafter-0:`` + traceback) and re-raised in the caller's thread, so
the trainer exits with code 5 and the log holds torch's own error text.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

_STOP = object()
POLL_S = 0.5


@dataclass
class StepFns:
    """The per-micro-batch work, supplied by the trainer (trainer.core.step)."""
    target_features: Callable[[Any, Any], Any]           # (target, batch) -> features (no_grad)
    drafter_loss: Callable[[Any, Any, Any], tuple]       # (drafter, features, batch) -> (loss, metrics)
    to_device: Callable[[Any, str], Any]                 # (batch, device) -> batch


@dataclass
class MicroResult:
    index: int
    replica: int
    loss: Any              # detached scalar tensor (unscaled loss of this micro-batch)
    metrics: dict = field(default_factory=dict)


class WorkerFailed(RuntimeError):
    pass


class ThreadedEngine:
    def __init__(self, *, targets: list[tuple[str, Any]], drafters: list[tuple[str, Any]],
                 fns: StepFns, gate, grad_accum: int, queue_depth: int = 2,
                 on_backward: Callable[[int, Any], Any] | None = None):
        self.targets, self.drafters, self.fns, self.gate = targets, drafters, fns, gate
        self.grad_accum = grad_accum
        self.on_backward = on_backward  # (replica, loss) -> loss, e.g. fault injection's nan
        self._target_in: list[queue.Queue] = [queue.Queue(maxsize=max(1, queue_depth)) for _ in targets]
        self._drafter_in: list[queue.Queue] = [queue.Queue(maxsize=max(1, queue_depth)) for _ in drafters]
        self._results: queue.Queue = queue.Queue()
        self._failed = threading.Event()
        self._errors: list[tuple[str, BaseException]] = []
        self._threads: list[threading.Thread] = []
        self._step_id = 0

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        for t, _ in enumerate(self.targets):
            self._spawn(f"target-{t}", self._target_loop, t)
        for r, _ in enumerate(self.drafters):
            self._spawn(f"drafter-{r}", self._drafter_loop, r)

    def stop(self) -> None:
        for q in self._target_in + self._drafter_in:
            try:
                q.put_nowait(_STOP)
            except queue.Full:
                pass
        self._failed.set()  # wakes every blocked put/get loop
        for th in self._threads:
            th.join(timeout=5.0)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _spawn(self, name, fn, arg) -> None:
        th = threading.Thread(target=self._guarded, args=(name, fn, arg), name=name, daemon=True)
        self._threads.append(th)
        th.start()

    def _guarded(self, name, fn, arg) -> None:
        try:
            self.gate.thread_setup()
            fn(arg)
        except BaseException as e:  # noqa: BLE001 - reported to the caller's thread
            if not self._failed.is_set() or not self._errors:
                print(f"Exception in thread {name}:", file=sys.stderr)
                traceback.print_exception(e, file=sys.stderr)
                sys.stderr.flush()
            self._errors.append((name, e))
            self._failed.set()

    # -- queue helpers that give up when another worker failed ---------------------------------
    def _get(self, q: queue.Queue):
        while True:
            try:
                item = q.get(timeout=POLL_S)
            except queue.Empty:
                if self._failed.is_set():
                    return _STOP
                continue
            return item

    def _put(self, q: queue.Queue, item) -> bool:
        while True:
            try:
                q.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                if self._failed.is_set():
                    return False

    # -- workers ------------------------------------------------------------------------------
    def _target_loop(self, t: int) -> None:
        import torch

        dev, target = self.targets[t]
        while True:
            item = self._get(self._target_in[t])
            if item is _STOP:
                return
            step_id, idx, batch = item
            r = idx % len(self.drafters)
            ddev = self.drafters[r][0]
            with torch.no_grad():
                feats = self.fns.target_features(target, self.fns.to_device(batch, dev))
                out = (step_id, idx, self.fns.to_device(batch, ddev), feats.to(ddev))
            if not self._put(self._drafter_in[r], out):
                return

    def _drafter_loop(self, r: int) -> None:
        dev, drafter = self.drafters[r]
        while True:
            item = self._get(self._drafter_in[r])
            if item is _STOP:
                return
            step_id, idx, batch, feats = item
            loss, metrics = self.fns.drafter_loss(drafter, feats, batch)
            if self.on_backward is not None:
                loss = self.on_backward(r, loss)
            with self.gate.guard("drafter backward"):
                (loss / self.grad_accum).backward()
            self._results.put((step_id, MicroResult(index=idx, replica=r, loss=loss.detach(),
                                                    metrics=_detach(metrics))))

    # -- one optimizer step's forward/backward ---------------------------------------------
    def run_step(self, micro_batches: list) -> list[MicroResult]:
        """Forward+backward of every micro-batch; gradients left in the replicas (unaveraged)."""
        n_expected = len(self.drafters) * self.grad_accum
        if len(micro_batches) != n_expected:
            raise ValueError(f"threads: expected {n_expected} micro-batches "
                             f"(drafters x grad_accum), got {len(micro_batches)}")
        self._step_id += 1
        sid = self._step_id
        for i, mb in enumerate(micro_batches):
            if not self._put(self._target_in[i % len(self.targets)], (sid, i, mb)):
                break
        got: dict[int, MicroResult] = {}
        while len(got) < n_expected:
            self._raise_if_failed()
            try:
                step_id, res = self._results.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if step_id == sid:
                got[res.index] = res
        return [got[i] for i in range(n_expected)]

    def _raise_if_failed(self) -> None:
        if self._failed.is_set() and self._errors:
            name, exc = self._errors[0]
            raise exc
        if self._failed.is_set():
            raise WorkerFailed("threads: a worker stopped without an error")

    def alive(self) -> bool:
        return all(th.is_alive() for th in self._threads)


def _detach(metrics: dict) -> dict:
    out = {}
    for k, v in (metrics or {}).items():
        out[k] = v.detach() if hasattr(v, "detach") else v
    return out
