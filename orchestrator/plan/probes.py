"""Probes: one shape for every fact dfo asks a target for.

A :class:`Probe` is a name, an argv (run through any transport: ``transport.run(probe.argv,
timeout=probe.timeout, env=probe.env)``) and a pure parser that takes the finished command
(anything with ``exit_code``, ``stdout`` and ``stderr``: a transport ``Result``, or a
recorded :class:`Reply` in tests) and returns typed data. Parsers are pure and tested on
recorded output, including awkward names (``fil () &&-@_e.txt``, spaces, quotes, unicode).
Values reach the far side only as positional parameters of constant scripts (``"$1"``) or
argv elements of constant Python modules, never inside a script.

Every remote fact is one: the host check's probes here and its GPU probes (``plan/gpu.py``:
driver, device nodes, nvidia-smi query/-q/apps, /dev/shm, memlock), the launch probe and the supervisor
query (here), the deploy's state probe (``deploy_plan.state_probe``), the env probe
(``fingerprint.env_probe``), the cache tool (``snapshot.tool_probe``), the source hash
(``cache_key.source_hash_probe``) and a ``model.init_from`` drafter's config.json
(``init_from.init_from_probe``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

from dfo_contract.markers import last_json_line
from dfo_contract.replies import LaunchProbeReply
from dfo_contract.status import QueryReply, StopReply

from ..common.errors import DfoError, RemoteCommandError
from .scripts import script_text

T = TypeVar("T")
#: the remote helper's typed replies (``typed_reply``)
HelperReply = TypeVar("HelperReply", QueryReply, StopReply)


class Output(Protocol):
    @property
    def exit_code(self) -> int: ...
    @property
    def stdout(self) -> bytes: ...
    @property
    def stderr(self) -> bytes: ...


@dataclass(frozen=True)
class Reply:
    """A finished command's output, as a parser sees it (recorded output in tests)."""

    exit_code: int = 0
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass(frozen=True)
class Probe(Generic[T]):
    """``argv`` to run on the target and the pure ``parse`` of what came back."""

    name: str
    argv: tuple[str, ...]
    parse: Callable[[Output], T]
    timeout: float = 60.0
    env: Mapping[str, str] | None = None  # extra environment for the remote command

    def parse_output(self, stdout: bytes | str = b"", stderr: bytes | str = b"",
                     exit_code: int = 0) -> T:
        """Parse recorded output (str is taken as UTF-8)."""
        enc = (lambda b: b.encode("utf-8") if isinstance(b, str) else b)
        return self.parse(Reply(exit_code, enc(stdout), enc(stderr)))


def text(b: bytes) -> str:
    return b.decode("utf-8", "replace")



def json_reply(output: str, what: str, *, error: type[DfoError] = RemoteCommandError,
               hint: str = "run it by hand with -v to see what it printed") -> dict[str, Any]:
    """The last JSON line of a remote helper's stdout, which must be an object (stray lines
    before it, e.g. a warning printed by the env, are ignored). ``error`` otherwise."""
    reply = last_json_line(output)
    if not isinstance(reply, dict):
        raise error(f"{what}: the remote helper's output is not JSON", hint=hint)
    return reply


# --------------------------------------------------------------------------- kernel

def kernel_probe() -> Probe[str | None]:
    return Probe("kernel", ("uname", "-srm"), parse_kernel)


def parse_kernel(out: Output) -> str | None:
    s = text(out.stdout).strip()
    return s if out.exit_code == 0 and s else None


# --------------------------------------------------------------------------- python

PYTHON_SNIPPET = "import sys,platform;print(platform.python_version());print(sys.executable)"
_FIND_PYTHON = ('for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then '
                'exec "$p" -c "$1"; fi; done; echo "no python3 on PATH" >&2; exit 127')


@dataclass(frozen=True)
class PythonInfo:
    version: str
    executable: str


def python_probe(python: str | None = None) -> Probe[PythonInfo | None]:
    """The target's Python: ``python`` when hosts.yaml names one, else python3 on PATH."""
    if python:
        return Probe("python", (python, "-c", PYTHON_SNIPPET), parse_python)
    return Probe("python", ("sh", "-c", _FIND_PYTHON, "sh", PYTHON_SNIPPET), parse_python)


def parse_python(out: Output) -> PythonInfo | None:
    if out.exit_code != 0:
        return None
    lines = text(out.stdout).splitlines()
    if len(lines) < 2 or not re.match(r"^\d+\.\d+", lines[0].strip()):
        return None
    return PythonInfo(version=lines[0].strip(), executable="\n".join(lines[1:]).strip())


# --------------------------------------------------------------------------- disk

#: df of the nearest existing directory at or above "$1" (the root may not exist yet)
_DF_SCRIPT = 'd="$1"; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done; df -Pk -- "$d"'
_DF_LINE_RE = re.compile(r"^(?P<fs>.*?)\s+(?P<total>\d+)\s+(?P<used>\d+)\s+(?P<avail>\d+)\s+"
                         r"(?P<cap>\d+%|-)\s+(?P<mount>/.*)$")


@dataclass(frozen=True)
class DiskFree:
    filesystem: str
    mount: str
    total_bytes: int
    free_bytes: int


def disk_probe(path: str) -> Probe[DiskFree | None]:
    if not path.startswith("/"):
        raise ValueError(f"disk_probe needs an absolute path, got {path!r}")
    return Probe("disk", ("sh", "-c", _DF_SCRIPT, "sh", path), parse_df)


def parse_df(out: Output) -> DiskFree | None:
    """``df -Pk`` output (POSIX: one line per filesystem, sizes in KiB). Filesystem and
    mount point may hold spaces and shell characters; the numbers anchor the split."""
    if out.exit_code != 0:
        return None
    lines = [ln for ln in text(out.stdout).splitlines() if ln.strip()]
    for line in reversed(lines[1:]):
        m = _DF_LINE_RE.match(line)
        if m:
            return DiskFree(filesystem=m["fs"], mount=m["mount"],
                            total_bytes=int(m["total"]) * 1024, free_bytes=int(m["avail"]) * 1024)
    return None


# --------------------------------------------------------------------------- gpus

@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int | None
    uuid: str


@dataclass(frozen=True)
class GpuReport:
    """The ``gpus`` of ``dfo hosts check`` (from ``plan.gpu``'s nvidia-smi query:
    ``gpu.gpu_report``)."""

    present: bool  # nvidia-smi exists
    gpus: tuple[Gpu, ...] = ()
    error: str | None = None


# --------------------------------------------------------------------------- init

def init_probe() -> Probe[str | None]:
    """The name of PID 1 (``systemd`` when systemd is init)."""
    return Probe("init", ("cat", "/proc/1/comm"), parse_init)


def parse_init(out: Output) -> str | None:
    s = text(out.stdout).strip()
    return s if out.exit_code == 0 and s else None


# --------------------------------------------------------------------------- directory listing

_FIND_FORMAT = r"%y %s %T@ %f\0"


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: str  # find's %y: f file, d directory, l symlink, ...
    size: int
    mtime: float


def list_dir_probe(path: str) -> Probe[list[DirEntry] | None]:
    """Entries directly under ``path`` (NUL-separated, so any name survives)."""
    if not path.startswith("/"):
        raise ValueError(f"list_dir_probe needs an absolute path, got {path!r}")
    return Probe("list_dir", ("find", path, "-mindepth", "1", "-maxdepth", "1", "-printf", _FIND_FORMAT),
                 parse_list_dir)


def parse_list_dir(out: Output) -> list[DirEntry] | None:
    """None when the directory does not exist."""
    if out.exit_code != 0 and b"No such file" in out.stderr:
        return None
    entries = []
    for rec in out.stdout.split(b"\0"):
        if not rec:
            continue
        kind, size, mtime, name = rec.split(b" ", 3)
        entries.append(DirEntry(name=name.decode("utf-8", "surrogateescape"), kind=kind.decode(),
                                size=int(size), mtime=float(mtime)))
    return sorted(entries, key=lambda e: e.name)


# --------------------------------------------------------------------------- launch probe

#: One round trip before a launch: init system, tools, env, run.lock. $1 root, $2 run.lock.
LAUNCH_PROBE_SCRIPT = script_text("launch_probe.sh")


def launch_probe(root: str, lock: str, *, owner: str = "", wait_s: int = 0
                 ) -> Probe[LaunchProbeReply]:
    """The launch probe; with ``owner``, it first waits up to ``wait_s`` seconds inside the
    container for that run's supervisor to hold run.lock (one round trip, not a poll)."""
    extra = (owner, str(int(wait_s))) if owner else ()
    return Probe("launch", ("sh", "-c", LAUNCH_PROBE_SCRIPT, "dfo-probe", root, lock, *extra),
                 lambda out: parse_launch_probe(text(out.stdout)))


def parse_launch_probe(output: str) -> LaunchProbeReply:
    """``key=value`` lines -> the typed reply (``LaunchProbeReply.from_lines``)."""
    return LaunchProbeReply.from_lines(output)


# --------------------------------------------------------------------------- supervisor query

QUERY_MODULE = "orchestrator.supervisor.query"


def query_probe(python: str, root: str, run: str | None = None) -> Probe[QueryReply]:
    """The runs on the host (only ``run`` when given) and run.lock's owner: the deployed
    env's query module."""
    argv = (python, "-m", QUERY_MODULE, "--root", root, *(("--run", run) if run else ()))
    return Probe("query", argv, lambda out: typed_reply(QueryReply, text(out.stdout),
                                                        "reading run state"))


def stop_probe(python: str, root: str, run_id: str) -> Probe[StopReply]:
    """Ask the run's supervisor to stop."""
    return Probe("stop", (python, "-m", QUERY_MODULE, "--root", root, "--stop", run_id),
                 lambda out: typed_reply(StopReply, text(out.stdout), "stopping the run"))


def typed_reply(cls: type[HelperReply], output: str, what: str) -> HelperReply:
    """``cls.from_json`` of the remote helper's reply (``json_reply``); RemoteCommandError
    when it is JSON but not such a reply."""
    try:
        return cls.from_json(json_reply(output, what))
    except ValueError as e:
        raise RemoteCommandError(f"{what}: the remote helper's reply is not one dfo reads "
                                 f"({e})", hint="deploy again: the host's env may be of "
                                 "another dfo version") from None


# --------------------------------------------------------------------------- the host check

@dataclass
class HostCheck:
    """What ``dfo hosts check`` reports for one host."""

    host: str
    transport: str
    target: str
    root: str
    reachable: bool = False
    container: str | None = None  # proxmox: running/stopped/...; None otherwise
    kernel: str | None = None
    python: PythonInfo | None = None
    disk: DiskFree | None = None
    gpus: GpuReport | None = None
    init: str | None = None
    gpu: Any = None  # plan.gpu.GpuFacts: the passthrough facts and their problems
    error: str | None = None
    exit_code: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def systemd_pid1(self) -> bool | None:
        return None if self.init is None else self.init == "systemd"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["systemd_pid1"] = self.systemd_pid1
        return d


def judge(check: HostCheck) -> HostCheck:
    """Fill ``problems`` from what was found (pure)."""
    p = check.problems
    if not check.reachable:
        p.append(check.error or "host unreachable")
        return check
    if check.container not in (None, "running"):
        p.append(f"container is {check.container}")
        return check
    if check.python is None:
        p.append("no python3 found on the target (install python3, or set python: in hosts.yaml)")
    if check.disk is None:
        p.append(f"cannot tell free disk under {check.root}")
    if check.gpu is not None:
        p.extend(check.gpu.problems)  # plan.gpu_judge, each with its fix
    elif check.gpus is not None and check.gpus.error:
        p.append(f"nvidia-smi failed: {check.gpus.error}")
    return check

