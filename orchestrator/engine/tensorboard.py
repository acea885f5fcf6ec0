"""``dfo tensorboard``: TensorBoard on the target, reachable on this machine's loopback.

TensorBoard runs where the event files are (the run dir in the container), started by
``orchestrator.remote.tensorboard_serve`` (sent as ``python -c``) from the deployed env's
interpreter, or ``--python``. It binds 127.0.0.1 on the target only; this side forwards a
local port to it over the existing connection (``transport.forward``). The far side stops
TensorBoard when its stdin closes, so ending dfo (Ctrl-C, or a dropped connection) stops
it. On the local transport TensorBoard itself listens on the local port, no forward.
"""

from __future__ import annotations

import logging
import threading

from dfo_contract.fsio import json_object
from dfo_contract.replies import TensorBoardReply

from ..common.errors import ConnectError, DeployError, NotFoundError, RemoteCommandError
from ..plan.scripts import remote_source
from ..transport import forward as fw

log = logging.getLogger("dfo")

DEFAULT_PORT = 6006
START_TIMEOUT_S = 240.0
SOURCE = remote_source("tensorboard_serve")


def serve_argv(python: str, *args: str) -> list[str]:
    return [python, "-c", SOURCE, *args]


class TensorBoard:
    """Start with ``start()``; ``url`` then answers; ``wait()`` blocks until TensorBoard
    exits; ``close()`` stops it and the forward."""

    def __init__(self, run_ops, run: str | None, *, port: int | None = None, python: str | None = None):
        self.run_ops = run_ops
        self.transport = run_ops.transport
        self.run_id = run_ops.current_run(run)
        self.logdir = run_ops.tree.run_dir(self.run_id)
        self.python = python or run_ops.tree.current_python
        self.port = port
        self.remote_port: int | None = None
        self.pipe: fw.Pipe | None = None
        self.forward: fw.LocalForward | None = None
        self.exit_info: TensorBoardReply | None = None
        self._done = threading.Event()
        self._watching = False    # the watch thread reads the pipe (and sets _done at its end)

    @property
    def url(self) -> str:
        port = self.forward.port if self.forward else self.remote_port
        return f"http://127.0.0.1:{port}/"

    def _local_port(self) -> int:
        if self.port is not None:
            return self.port
        return DEFAULT_PORT if fw.port_free(DEFAULT_PORT) else 0

    def start(self) -> str:
        if self.transport.is_local:
            want = self._local_port()
            if self.port is not None:
                fw.listen(want).close()  # busy: one clear error now, not TensorBoard's
        else:
            want = 0
        self.pipe = fw.open_pipe(self.transport, serve_argv(self.python, "serve", self.logdir, str(want)))
        try:
            reply = self._first_reply()
        except BaseException:  # Ctrl-C while TensorBoard starts: stop it too
            self.close(timeout=5.0)
            raise
        if reply.error is not None or reply.port is None:
            self.close()
            raise self._error(reply)
        self.remote_port = reply.port
        self._watching = True
        threading.Thread(target=self._watch, daemon=True, name="dfo-tensorboard").start()
        if not self.transport.is_local:
            try:
                self.forward = fw.LocalForward(
                    self.transport, self.remote_port, port=self._local_port(),
                    relay_argv=lambda p: serve_argv(self.python, "relay", str(p)))
            except BaseException:
                self.close()
                raise
        log.info("tensorboard for %s: %s on %s port %s", self.run_id, self.url, self.transport.name,
                 self.remote_port)
        return self.url

    def _first_reply(self) -> TensorBoardReply:
        box: dict[str, TensorBoardReply | bool] = {}
        pipe = self.pipe
        assert pipe is not None, "start() opens the pipe first"

        def read():
            while True:
                line = pipe.readline()
                if not line:
                    box["eof"] = True
                    return
                obj = json_object(line)   # None: a warning the interpreter printed
                rec = TensorBoardReply.from_json(obj) if obj is not None else None
                if rec is not None and (rec.port is not None or rec.error is not None):
                    box["rec"] = rec
                    return

        th = threading.Thread(target=read, daemon=True)
        th.start()
        th.join(START_TIMEOUT_S)
        rec = box.get("rec")
        if isinstance(rec, TensorBoardReply):
            return rec
        if "eof" in box:
            return TensorBoardReply(error="no-start")
        return TensorBoardReply(error="timeout",
                                detail=f"no answer after {START_TIMEOUT_S:.0f}s")

    def _error(self, reply: TensorBoardReply):
        err, detail = reply.error, reply.detail
        host = self.run_ops.host.name
        if err == "no-tensorboard":
            return DeployError(
                f"tensorboard is not installed in {detail or self.python} on {host}",
                hint="give an interpreter that has it with --python PATH, deploy a profile "
                     "with tensorboard in requirements.in, or use `dfo plot`")
        if err == "no-logdir":
            return NotFoundError(f"no run {self.run_id} on {host} ({detail} is missing)",
                                 hint="see `dfo status` for run ids")
        if err == "no-start":
            return DeployError(f"could not run {self.python} on {host}",
                               hint=f"run `dfo deploy --host {host}` or pass --python PATH")
        return RemoteCommandError(f"tensorboard did not start on {host}: {err}"
                                  + (f": {detail}" if detail else ""),
                                  hint="run it again with -vv to see more")

    def _watch(self) -> None:
        pipe = self.pipe  # close() drops it; this thread reads on until EOF
        try:
            while pipe is not None:
                line = pipe.readline()
                if not line:
                    break
                obj = json_object(line)
                rec = TensorBoardReply.from_json(obj) if obj is not None else None
                if rec is not None and "exit" in (obj or {}):
                    self.exit_info = rec
        except Exception:  # noqa: BLE001 - the connection went away
            pass
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until TensorBoard exits (True) or ``timeout`` passes (False)."""
        return self._done.wait(timeout)

    def close(self, timeout: float = 20.0) -> None:
        if self.forward is not None:
            self.forward.close()
        if self.pipe is not None:
            self.pipe.shutdown_write()
            if self._watching:    # before TensorBoard answered, nothing reads to its end
                self._done.wait(timeout)
            self.pipe.close()
            self.pipe = None


def run_until_interrupted(tb: TensorBoard, poll: float = 0.5) -> TensorBoardReply:
    """Block until TensorBoard exits by itself (returns its exit record) or Ctrl-C
    (KeyboardInterrupt propagates after stopping it)."""
    try:
        while not tb.wait(poll):
            pass
        if tb.exit_info is None:
            raise ConnectError(f"lost the connection to {tb.transport.name}; tensorboard stopped with it",
                               hint="run `dfo tensorboard` again")
        if tb.exit_info.exit not in (0, None):
            raise RemoteCommandError(f"tensorboard on {tb.transport.name} exited {tb.exit_info.exit}: "
                                     f"{tb.exit_info.detail or 'no output'}",
                                     hint="run `dfo tensorboard` again")
        return tb.exit_info
    finally:
        tb.close()
