"""Counting a transport's round trips (tests and bench/bench_launch_rtt.py): a transport
wrapper that records each call of ``run``/``stream``/``put``/``get`` (one round trip each)
and the SSH channels under them (``_exec``: one per command, plus the proxmox transport's
once-per-connection ``pct status``), and which call started the supervisor: the one that
carries ``-m orchestrator.supervisor --run-dir`` (in its argv, or in the steps sent on its
stdin). Stdlib only, no dfo import: the bench loads it by path for any checkout.
"""

from __future__ import annotations

import time


class CountingTransport:
    """A transport that records every call it passes on (and its SSH channels)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[dict] = []
        self.channels = 0
        self.start_call: int | None = None     # index of the call that started the supervisor
        self.channels_at_start: int | None = None
        self.t_start: float | None = None
        if hasattr(inner, "_exec"):
            real = inner._exec

            def _exec(*a, **kw):
                self.channels += 1
                return real(*a, **kw)
            inner._exec = _exec

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _call(self, kind: str, what: str, starts: bool, fn):
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            dt = time.perf_counter() - t0
            self.calls.append({"kind": kind, "what": what[:80], "s": round(dt, 4)})
            if starts and self.start_call is None:
                self.start_call = len(self.calls)
                self.channels_at_start = self.channels
                self.t_start = time.perf_counter()

    @staticmethod
    def _starts(argv, stdin) -> bool:
        text = " ".join(map(str, argv)) + " " + (stdin or b"").decode("utf-8", "replace")
        return "orchestrator.supervisor" in text and "--run-dir" in text \
            and "orchestrator.supervisor.query" not in text

    def run(self, argv, **kw):
        return self._call("run", " ".join(map(str, argv[:3])), self._starts(argv, kw.get("stdin")),
                          lambda: self.inner.run(argv, **kw))

    def stream(self, argv, on_line, **kw):
        return self._call("stream", " ".join(map(str, argv[:3])), False,
                          lambda: self.inner.stream(argv, on_line, **kw))

    def put(self, data, remote_path, **kw):
        return self._call("put", str(remote_path), False,
                          lambda: self.inner.put(data, remote_path, **kw))

    def get(self, remote_path):
        return self._call("get", str(remote_path), False, lambda: self.inner.get(remote_path))
