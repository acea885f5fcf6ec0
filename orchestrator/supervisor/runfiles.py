"""A run directory's files on disk (formats and names: orchestrator.ops.runstate).

``state.json`` is replaced atomically (dfo_contract.fsio); each ``events.jsonl`` record is
appended with one ``write(2)`` on an ``O_APPEND`` fd, so a reader following by byte offset
never sees half a record followed by another writer's bytes.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from dfo_contract.fsio import atomic_write_json, read_json

from ..ops import runstate as rs
from ..ops.runstate import RunState

__all__ = ["append_event", "read_spec", "read_state", "write_json_atomic",
           "write_state"]


def write_json_atomic(path: str, obj: Any) -> None:
    """JSON (non-finite floats as strings, sorted keys, indent 1) written atomically."""
    atomic_write_json(path, rs.clean(obj), indent=1, sort_keys=True)


def write_state(run_dir: str, state: RunState) -> None:
    write_json_atomic(os.path.join(run_dir, rs.STATE_FILE), state.to_json())


def read_state(run_dir: str) -> RunState:
    """The run's state.json. Raises OSError (absent) or ValueError (not a state)."""
    return RunState.from_json(read_json(os.path.join(run_dir, rs.STATE_FILE)))


def read_spec(run_dir: str) -> dict:
    spec = read_json(os.path.join(run_dir, rs.SPEC_FILE))
    if not isinstance(spec, dict):
        raise ValueError(f"{rs.SPEC_FILE} is not a JSON object")
    return spec


def append_event(path: str, rec: Mapping[str, Any]) -> None:
    """Append one record as a single line with a single write (see the module doc)."""
    line = rs.event_line(rec)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
