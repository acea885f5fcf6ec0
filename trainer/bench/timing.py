"""Wall-clock timing of a device's work: synchronize, run ``iters`` times, synchronize."""

from __future__ import annotations

import time

import torch


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timeit(fn, dev, iters: int) -> float:
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) / iters
