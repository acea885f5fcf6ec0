"""Download/install progress from ``uv pip sync``'s output lines (pure).

uv prints, also without a terminal: ``Resolved 57 packages in 2ms``, ``Downloading torch
(858.1MiB)``, `` Downloaded torch``, ``Prepared 57 packages in 1m 02s``, ``Installed 57
packages in 9.1s``. A GPU env is several GB; :class:`UvProgress` turns those lines into one
summary a person can follow (``downloading: 3 of 12 done, 1.9 GiB of 4.4 GiB; torch``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dfo_contract.fsio import human_bytes  # noqa: F401 (dfo's one formatter of byte counts)

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_DOWNLOADING = re.compile(r"^\s*Downloading (?P<name>\S+) \((?P<num>[\d.]+)(?P<unit>[KMGT]?i?B)\)\s*$")
_DOWNLOADED = re.compile(r"^\s*Downloaded (?P<name>\S+)\s*$")
_PHASE = re.compile(r"^\s*(?P<what>Resolved|Prepared|Installed|Uninstalled) (?P<n>\d+) packages?\b")


@dataclass
class UvProgress:
    sizes: dict[str, int] = field(default_factory=dict)  # announced large downloads
    done: set[str] = field(default_factory=set)
    phase: str = ""

    def feed(self, line: str) -> str | None:
        """A new summary when ``line`` changes the picture, else None."""
        m = _DOWNLOADING.match(line)
        if m:
            self.sizes[m["name"]] = int(float(m["num"]) * _UNITS.get(m["unit"], 1))
            return self.summary(m["name"])
        m = _DOWNLOADED.match(line)
        if m:
            self.done.add(m["name"])
            return self.summary(m["name"])
        m = _PHASE.match(line)
        if m:
            self.phase = line.strip()
            return self.phase
        return None

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def done_bytes(self) -> int:
        return sum(v for k, v in self.sizes.items() if k in self.done)

    def summary(self, last: str = "") -> str:
        return (f"downloading: {len(self.done & set(self.sizes))} of {len(self.sizes)} large files done, "
                f"{human_bytes(self.done_bytes)} of {human_bytes(self.total_bytes)}"
                + (f"; {last}" if last else ""))


def parse_du_k(output: str) -> int | None:
    """``du -sk PATH`` -> bytes."""
    first = output.strip().split(None, 1)
    return int(first[0]) * 1024 if first and first[0].isdigit() else None
