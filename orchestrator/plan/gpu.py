"""GPU facts of a target and the passthrough problems they show (pure).

Each fact is one :class:`~orchestrator.plan.probes.Probe` (a constant script and a pure
parser), tested on output recorded on an H200 machine (``tests/fixtures/gpu/h200/``) and
on edited copies for each failure. :func:`gpu_problems` turns the facts into one-line
problems, each with its fix; a target without any NVIDIA driver is "no GPU", not a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..common.gpu_apps import APPS_QUERY, GpuApp, parse_apps_csv
from .probes import DiskFree, Gpu, GpuReport, Output, Probe, parse_df, text

#: CUDA runtime (torch.version.cuda) -> the oldest driver branch that runs it
#: (NVIDIA's CUDA toolkit release notes, "minimum required driver version")
MIN_DRIVER = {"13.0": 580, "12.9": 575, "12.8": 570, "12.6": 560, "12.4": 550, "12.1": 530,
              "11.8": 520}
#: NCCL keeps its buffers in /dev/shm; docker's 64 MiB default is the classic failure
MIN_SHM_BYTES = 1 << 30
#: memory in use on an idle GPU stays well below this
BUSY_MIB = 1024
#: NCCL and pinned host memory want memlock unlimited; below this it is a problem (KiB)
MIN_MEMLOCK_KIB = 64 * 1024

_QUERY_FIELDS = "index,name,uuid,memory.total,memory.used,driver_version,pci.bus_id," \
                "utilization.gpu,compute_cap"
_QUERY_SCRIPT = ('command -v nvidia-smi >/dev/null 2>&1 || exit 127; '
                 f'exec nvidia-smi --query-gpu={_QUERY_FIELDS} --format=csv,noheader,nounits')
_APPS_SCRIPT = ('command -v nvidia-smi >/dev/null 2>&1 || exit 127; exec nvidia-smi '
                + " ".join(APPS_QUERY))
_SMI_Q_SCRIPT = 'command -v nvidia-smi >/dev/null 2>&1 || exit 127; exec nvidia-smi -q'
#: the kernel module's version, then the user-space libraries' (one "lib PATH" a line)
_DRIVER_SCRIPT = r"""
[ -r /proc/driver/nvidia/version ] || exit 3
cat /proc/driver/nvidia/version
echo "@@libs"
{ ldconfig -p 2>/dev/null | sed -n 's/.*=> //p'
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib /usr/local/nvidia/lib64; do
    ls -1 "$d"/libnvidia-ml.so.* 2>/dev/null
  done; } | grep 'libnvidia-ml\.so\.[0-9]*\.[0-9]' | sort -u
exit 0
"""
#: every device node the driver needs, and whether this container may open it
_DEVNODES_SCRIPT = r"""
n=0
if [ -d /proc/driver/nvidia/gpus ]; then
  n=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 | wc -l)
fi
echo "gpus $n"
i=0; set --
while [ "$i" -lt "$n" ]; do set -- "$@" "/dev/nvidia$i"; i=$((i + 1)); done
for f in "$@" /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
  if [ ! -e "$f" ]; then echo "missing - $f"; continue; fi
  mm=$(stat -L -c '%t:%T' "$f" 2>/dev/null || echo -)
  if err=$( { exec 3<"$f"; } 2>&1 ); then echo "ok $mm $f"; else echo "denied $mm $f $err"; fi
done
"""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_mib: int | None
    memory_used_mib: int | None
    driver: str | None
    bus_id: str | None
    utilization: int | None
    compute_cap: str | None


@dataclass(frozen=True)
class GpuQuery:
    present: bool  # nvidia-smi exists
    gpus: tuple[GpuInfo, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class SmiSummary:
    """``nvidia-smi -q``: what the driver says about itself."""

    present: bool
    driver: str | None = None
    cuda: str | None = None  # the newest CUDA runtime this driver runs
    attached: int | None = None
    error: str | None = None  # e.g. "Failed to initialize NVML: Driver/library version mismatch"


@dataclass(frozen=True)
class DriverVersions:
    kernel: str | None  # /proc/driver/nvidia/version (None: no NVIDIA kernel module)
    libraries: tuple[tuple[str, str], ...] = ()  # (path, version) of libnvidia-ml.so.<ver>


@dataclass(frozen=True)
class DevNode:
    path: str
    state: str  # ok, missing, denied
    major: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class DevNodes:
    expected_gpus: int
    nodes: tuple[DevNode, ...] = ()


@dataclass
class GpuFacts:
    """Everything the host check knows about the target's GPUs."""

    query: GpuQuery | None = None
    smi: SmiSummary | None = None
    apps: tuple[GpuApp, ...] = ()
    driver: DriverVersions | None = None
    devnodes: DevNodes | None = None
    shm: DiskFree | None = None
    memlock_kib: int | None = None  # None: unlimited
    memlock_known: bool = False
    present: bool = False
    driver_version: str | None = None
    max_cuda: str | None = None
    problems: list[str] = field(default_factory=list)


def _int(s: str) -> int | None:
    s = s.strip()
    return int(s) if s.isdigit() else None


def _first_line(out: Output, default: str) -> str:
    lines = [ln.strip() for ln in (text(out.stdout) + "\n" + text(out.stderr)).splitlines() if ln.strip()]
    return lines[0] if lines else default


# --------------------------------------------------------------------------- probes

def gpu_report(q: GpuQuery | None) -> GpuReport:
    """The query as ``dfo hosts check`` reports its GPUs."""
    return GpuReport(present=bool(q and q.present), error=q.error if q else None,
                     gpus=tuple(Gpu(g.index, g.name, g.memory_mib, g.uuid)
                                for g in (q.gpus if q else ())))


def query_probe() -> Probe[GpuQuery]:
    return Probe("gpu_query", ("sh", "-c", _QUERY_SCRIPT), parse_query)


def parse_query(out: Output) -> GpuQuery:
    """The query CSV; the name (2nd column) may hold commas: the 7 fields after it are
    split off from the right."""
    if out.exit_code == 127:
        return GpuQuery(present=False)
    if out.exit_code != 0:
        return GpuQuery(present=True, error=_first_line(out, f"nvidia-smi exited {out.exit_code}"))
    gpus: list[GpuInfo] = []
    for line in text(out.stdout).splitlines():
        if not line.strip():
            continue
        head, _, rest = line.partition(",")
        parts = rest.rsplit(",", 7)
        if not head.strip().isdigit() or len(parts) != 8:
            return GpuQuery(True, tuple(gpus), f"unexpected nvidia-smi line: {line!r}")
        name, uuid, total, used, drv, bus, util, cap = (p.strip() for p in parts)
        gpus.append(GpuInfo(index=int(head), name=name, uuid=uuid, memory_mib=_int(total),
                            memory_used_mib=_int(used), driver=drv or None, bus_id=bus or None,
                            utilization=_int(util), compute_cap=cap if cap[:1].isdigit() else None))
    return GpuQuery(present=True, gpus=tuple(gpus))


def apps_probe() -> Probe[tuple[GpuApp, ...] | None]:
    return Probe("gpu_apps", ("sh", "-c", _APPS_SCRIPT), parse_apps)


def parse_apps(out: Output) -> tuple[GpuApp, ...] | None:
    """Compute processes on the GPUs (None when nvidia-smi could not say)."""
    if out.exit_code != 0:
        return None
    return tuple(parse_apps_csv(text(out.stdout)))


def smi_probe() -> Probe[SmiSummary]:
    return Probe("nvidia_smi_q", ("sh", "-c", _SMI_Q_SCRIPT), parse_smi_q)


_KV = re.compile(r"^(?P<k>[A-Za-z][A-Za-z ]*?)\s*:\s*(?P<v>.*?)\s*$")


def parse_smi_q(out: Output) -> SmiSummary:
    if out.exit_code == 127:
        return SmiSummary(present=False)
    if out.exit_code != 0:
        return SmiSummary(present=True, error=_first_line(out, f"nvidia-smi exited {out.exit_code}"))
    top: dict[str, str] = {}
    for line in text(out.stdout).splitlines():
        if line[:1].isspace():
            continue  # per-GPU sections are indented
        m = _KV.match(line)
        if m:
            top[m["k"]] = m["v"]
    return SmiSummary(present=True, driver=top.get("Driver Version") or None,
                      cuda=top.get("CUDA Version") or None, attached=_int(top.get("Attached GPUs", "")))


def driver_probe() -> Probe[DriverVersions]:
    return Probe("nvidia_driver", ("sh", "-c", _DRIVER_SCRIPT), parse_driver)


_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
_LIBVER = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def parse_driver(out: Output) -> DriverVersions:
    if out.exit_code != 0:
        return DriverVersions(kernel=None)
    body, _, libs = text(out.stdout).partition("@@libs")
    m = _NVRM.search(body + " ")
    found = []
    for ln in libs.splitlines():
        lm = _LIBVER.search(ln.strip())
        if lm:
            found.append((ln.strip(), lm.group(1)))
    return DriverVersions(kernel=m.group(1) if m else None, libraries=tuple(found))


def devnodes_probe() -> Probe[DevNodes]:
    return Probe("nvidia_devnodes", ("sh", "-c", _DEVNODES_SCRIPT), parse_devnodes)


def parse_devnodes(out: Output) -> DevNodes:
    n, nodes = 0, []
    for line in text(out.stdout).splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "gpus" and len(parts) == 2 and parts[1].isdigit():
            n = int(parts[1])
        elif parts[0] in ("ok", "missing", "denied") and len(parts) >= 3:
            major = int(parts[1].split(":")[0], 16) if ":" in parts[1] else None
            nodes.append(DevNode(path=parts[2], state=parts[0], major=major,
                                 detail=parts[3].strip() if len(parts) > 3 else ""))
    return DevNodes(expected_gpus=n, nodes=tuple(nodes))


def shm_probe() -> Probe[DiskFree | None]:
    return Probe("shm", ("df", "-Pk", "/dev/shm"), parse_df)


def memlock_probe() -> Probe[tuple[bool, int | None]]:
    """``(known, KiB)``; KiB None means unlimited."""
    return Probe("memlock", ("sh", "-c", "ulimit -l"), parse_memlock)


def parse_memlock(out: Output) -> tuple[bool, int | None]:
    s = text(out.stdout).strip()
    if out.exit_code != 0 or not s:
        return (False, None)
    if s == "unlimited":
        return (True, None)
    return (True, int(s)) if s.isdigit() else (False, None)
