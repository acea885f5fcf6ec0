"""The remote root's directory tree (one directory per host, ``root:`` in hosts.yaml).

::

    <root>/
      envs/<profile>-<lockhash>/      venvs; fingerprint.json beside each; envs/current -> active
      envs/<profile>-<lockhash>.<n>/  a later generation of the same env (a repair, an update)
      cache/<key>/                    TORCHINDUCTOR_CACHE_DIR + TRITON_CACHE_DIR for that key
      cache/snapshots/<key>.tar + <key>.manifest.json
      runs/<run-id>/                  state.json, events.jsonl, attempt-<n>.log, metrics.jsonl, stacks/
      checkpoints/<run-name>/step_N/  manifest.json written last
      locks/                          deploy.lock, run.lock (flock)
      bin/uv                          the uv binary dfo pushed
      wheels/                         the project's wheel(s) dfo pushed

Paths are plain POSIX strings: they are used on the far side, never on this machine.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

_GENERATION = re.compile(r"^(.+-[0-9a-f]{12})\.([0-9]+)$")


def env_generation(name: str) -> tuple[str, int]:
    """An env dir name -> (the env it is a generation of, its number): ``cpu-0123456789ab``
    is generation 1 of itself, ``cpu-0123456789ab.3`` generation 3 of ``cpu-0123456789ab``.
    A repair or update never changes an env in place: it builds the next generation."""
    m = _GENERATION.match(name)
    if m and int(m.group(2)) >= 2:
        return m.group(1), int(m.group(2))
    return name, 1


def generation_name(base: str, gen: int) -> str:
    return base if gen <= 1 else f"{base}.{gen}"


@dataclass(frozen=True)
class HostTree:
    root: str

    def _j(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # envs
    @property
    def envs(self) -> str:
        return self._j("envs")

    def env_dir(self, profile: str, lock_hash: str) -> str:
        """The env a lock wants (its first generation; see ``env_generation``)."""
        return self._j("envs", f"{profile}-{lock_hash[:12]}")

    @property
    def current_env(self) -> str:
        return self._j("envs", "current")

    @property
    def previous_env(self) -> str:
        return self._j("envs", "previous")

    @property
    def current_python(self) -> str:
        return self._j("envs", "current", "bin", "python")

    # tools pushed by dfo
    @property
    def uv(self) -> str:
        return self._j("bin", "uv")

    @property
    def wheels(self) -> str:
        return self._j("wheels")

    # compile cache
    @property
    def cache(self) -> str:
        return self._j("cache")

    def cache_dir(self, key: str) -> str:
        return self._j("cache", key)

    @property
    def snapshots(self) -> str:
        return self._j("cache", "snapshots")

    # runs
    @property
    def runs(self) -> str:
        return self._j("runs")

    def run_dir(self, run_id: str) -> str:
        return self._j("runs", run_id)

    def checkpoints(self, run_name: str) -> str:
        return self._j("checkpoints", run_name)

    # locks
    @property
    def locks(self) -> str:
        return self._j("locks")

    @property
    def deploy_lock(self) -> str:
        return self._j("locks", "deploy.lock")

    @property
    def run_lock(self) -> str:
        return self._j("locks", "run.lock")
