"""TensorBoard event files without tensorboard: TFRecord framing + a hand-encoded ``Event``.

The trainer's env is hash-locked and carries no tensorboard (nor protobuf), so this module
writes the format itself; TensorBoard (run anywhere, e.g. ``dfo tensorboard``) reads it.

File: ``<dir>/events.out.tfevents.<unix time>.<host>.<pid>`` (the pid keeps two attempts
started within one second apart). Each record is TFRecord-framed::

    uint64 length (little endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

and ``data`` is a serialized ``tensorflow.Event``: ``wall_time`` (1, double), ``step``
(2, int64), ``file_version`` (3, string, only in the first record: ``brain.Event:2``) or
``summary`` (5) with repeated ``value`` (1) of ``{tag (1, string), simple_value (2, float)}``.

``ScalarWriter.write(step, rec)`` writes one event holding every numeric field of a metrics
record (booleans and the step itself left out); a list of numbers becomes ``name/0``,
``name/1``, ... (e.g. ``acc_per_pos/3``). New fields of the metrics record appear by
themselves. Each event is flushed, so TensorBoard sees it while the run goes on.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from typing import Any, BinaryIO, Iterable, Mapping

FILE_VERSION = "brain.Event:2"
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord: length, masked crc of the length, data, masked crc of the data."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


# --- protobuf wire format (only what an Event needs) -------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: negative numbers as ten-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def encode_value(tag: str, value: float) -> bytes:
    """``Summary.Value{tag, simple_value}``."""
    return _len_field(1, tag.encode("utf-8")) + _key(2, 5) + struct.pack("<f", value)


def encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                 values: Iterable[tuple[str, float]] = ()) -> bytes:
    out = _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _len_field(3, file_version.encode("utf-8"))
    summary = b"".join(_len_field(1, encode_value(t, v)) for t, v in values)
    if summary or file_version is None:
        out += _len_field(5, summary)
    return out


def scalars(rec: Mapping[str, Any], *, skip: Iterable[str] = ("step",)) -> list[tuple[str, float]]:
    """The numeric fields of a metrics record as (tag, value); lists as ``name/i``."""
    skip = set(skip)
    out: list[tuple[str, float]] = []
    for k, v in rec.items():
        if k in skip:
            continue
        if isinstance(v, (list, tuple)):
            out += [(f"{k}/{i}", float(x)) for i, x in enumerate(v) if _number(x)]
        elif _number(v):
            out.append((k, float(v)))
    return out


def _number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def event_file_name(now: float | None = None) -> str:
    now = time.time() if now is None else now
    host = socket.gethostname().replace("/", "_") or "localhost"
    return f"events.out.tfevents.{int(now)}.{host}.{os.getpid()}"


class ScalarWriter:
    """Appends scalar events to one event file in ``logdir`` (created on the first write)."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self.path: str | None = None
        self._f: BinaryIO | None = None

    def _open(self) -> BinaryIO:
        os.makedirs(self.logdir, exist_ok=True)
        now = time.time()
        self.path = os.path.join(self.logdir, event_file_name(now))
        f = self._f = open(self.path, "ab")
        f.write(frame(encode_event(now, 0, file_version=FILE_VERSION)))
        f.flush()
        return f

    def write(self, step: int, rec: Mapping[str, Any], *, wall_time: float | None = None) -> None:
        values = scalars(rec)
        if not values:
            return
        f = self._f if self._f is not None else self._open()
        t = time.time() if wall_time is None else wall_time
        f.write(frame(encode_event(t, step, values=values)))
        f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
