"""The GPUs' compute processes as ``nvidia-smi`` lists them (pure): the query's arguments and
its parser. The supervisor samples them beside a run (``supervisor.hostprobe``) and ``dfo
hosts check`` asks for them (``gpu.apps_probe``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: nvidia-smi's arguments that list the compute processes on the GPUs (:func:`parse_apps_csv`)
APPS_QUERY = ("--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
              "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class GpuApp:
    """One compute process on a GPU, as ``nvidia-smi`` lists it (``APPS_QUERY``)."""
    gpu_uuid: str
    pid: int | None
    used_mib: int | None
    name: str


def _int(s: str) -> int | None:
    s = s.strip()
    return int(s) if s.isdigit() else None


def parse_apps_csv(csv_text: str) -> list[GpuApp]:
    """The output of ``nvidia-smi`` with ``APPS_QUERY`` -> apps (other lines skipped)."""
    apps = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) == 4:
            apps.append(GpuApp(gpu_uuid=parts[0], pid=_int(parts[1]), used_mib=_int(parts[2]),
                               name=parts[3]))
    return apps
