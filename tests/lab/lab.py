"""The lab as one object: the sshd "Proxmox node", the pct stand-in on its PATH,
the LXC container(s), and leases so that several test sessions (and a person
who ran ``python -m tests.lab up``) can share one lab.

Leases: every ``up`` records a lease (the holder's PID and start time, or
"manual"); ``release`` drops it, and the last holder out stops the sshd and the
containers (they stay built). Leases of dead processes are pruned, so a killed
test run never keeps the lab alive nor breaks the next ``up``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dfo_contract.fsio import atomic_write_bytes, atomic_write_text
from dfo_contract.procs import process_start, same_process

from . import netns
from .container import WHEELHOUSE_IN_CT, Container
from .procs import file_lock
from .sshd import LabUnavailable, Sshd

PCT_SOURCE = Path(__file__).resolve().with_name("pct")
DEFAULT_VMID = 200
SCRATCH_VMID = 201  # a second container that tests may stop and start freely


MACHINE_STATE_DIR = Path("/var/lib/dfo-lab")


def default_state_dir() -> Path:
    """$DFO_LAB_DIR, else /var/lib/dfo-lab: one lab per machine, shared by every
    checkout (the LXC containers are per machine anyway; a per-checkout state
    dir would make two clones fight over the container's wheelhouse mount)."""
    return Path(os.environ.get("DFO_LAB_DIR") or MACHINE_STATE_DIR)


@dataclass(frozen=True)
class LabInfo:
    ssh_host: str
    ssh_port: int
    ssh_user: str
    identity_file: str
    known_hosts: str
    ssh_config: str  # OpenSSH client config with Host "dfo-lab-node"
    host_public_key: str  # "ssh-ed25519 AAAA..." (the node's host key)
    vmid: int | None  # None when brought up without the container
    container_name: str | None
    wheelhouse_host_dir: str
    wheelhouse_container_dir: str
    state_dir: str
    bin_dir: str  # on the node's PATH in sshd sessions; holds `pct`
    timings: dict = field(default_factory=dict, compare=False)

    def hosts_yaml(self, root: str = "/root/dfo", *, node_root: str | None = None,
                   default: str = "lab", profile: str = "cpu", wheelhouse: bool = False) -> str:
        """hosts.yaml text with hosts ``lab`` (proxmox -> this container) and
        ``lab-node`` (plain ssh to the node). ``node_root`` defaults to a dir in
        the lab's state dir, so nothing is written to this machine's /root.
        ``wheelhouse=True`` adds ``wheelhouse:`` (the container's /mnt/wheelhouse,
        the node's host dir)."""
        node_root = node_root or str(Path(self.state_dir) / "node-root")
        ssh = self.ssh_yaml()
        out = [f"default: {default}", "hosts:"]
        if self.vmid is not None:
            out += ["  lab:",
                    "    transport: proxmox",
                    f"    ssh: {ssh}",
                    f"    vmid: {self.vmid}",
                    f"    root: {root}",
                    f"    profile: {profile}",
                    "    gpus: {target: [cpu], drafter: [cpu]}"]
            if wheelhouse:
                out.append(f"    wheelhouse: {self.wheelhouse_container_dir}")
        out += ["  lab-node:",
                "    transport: ssh",
                f"    ssh: {ssh}",
                f"    root: {node_root}",
                f"    profile: {profile}",
                "    gpus: {target: [cpu], drafter: [cpu]}"]
        if wheelhouse:
            out.append(f"    wheelhouse: {self.wheelhouse_host_dir}")
        if self.vmid is None and default == "lab":
            out[0] = "default: lab-node"
        return "\n".join(out) + "\n"

    def ssh_yaml(self) -> str:
        """The hosts.yaml ``ssh:`` flow mapping that reaches the node."""
        return (f"{{host: {self.ssh_host}, port: {self.ssh_port}, user: {self.ssh_user}, "
                f"identity_file: {self.identity_file}, known_hosts: {self.known_hosts}}}")

    def ssh_argv(self, *remote: str) -> list[str]:
        """OpenSSH client argv to the node; quote ``remote`` yourself (shlex.join)."""
        return ["ssh", "-F", self.ssh_config, "dfo-lab-node", *remote]


class Lab:
    def __init__(self, state_dir: Path | str | None = None, *, vmid: int = DEFAULT_VMID):
        self.state_dir = Path(state_dir or default_state_dir()).resolve()
        self.vmid = int(vmid)
        self.bin_dir = self.state_dir / "bin"
        self.wheelhouse = self.state_dir / "wheelhouse"
        self.logs = self.state_dir / "logs"
        self.leases_dir = self.state_dir / "leases"
        self.lock = self.state_dir / "lab.lock"
        self.sshd = Sshd(self.state_dir / "sshd", path_dirs=[str(self.bin_dir)])
        self.container = Container(self.vmid, wheelhouse=self.wheelhouse, log_dir=self.logs)

    # ------------------------------------------------------------------- up
    def up(self, *, container: bool = True, lease: str | None = None) -> LabInfo:
        """Bring up what is missing (sshd, then the container) and take a lease.
        ``lease`` defaults to this process; "manual" is kept until ``down``."""
        timings: dict[str, float] = {}
        with file_lock(self.lock):
            self._take_lease(lease)
            t0 = time.monotonic()
            self._install_pct()
            self.sshd.up()
            timings["sshd_s"] = round(time.monotonic() - t0, 3)
            if container:
                timings.update(self._container_up(self.container))
        return self.info(container=container, timings=timings)

    def scratch(self, vmid: int = SCRATCH_VMID) -> Container:
        """A second built container that tests may stop/start at will (it is
        never the one other sessions run commands in). Left in whatever state."""
        with file_lock(self.lock):
            ct = Container(vmid, log_dir=self.logs)
            self._own(ct)
            ct.build()
            ct.configure()
            return ct

    def info(self, *, container: bool = True, timings: dict | None = None) -> LabInfo:
        s = self.sshd.info()
        return LabInfo(
            ssh_host=s.host, ssh_port=s.port, ssh_user=s.user,
            identity_file=s.identity_file, known_hosts=s.known_hosts,
            ssh_config=s.ssh_config, host_public_key=s.host_public_key,
            vmid=self.vmid if container else None,
            container_name=self.container.name if container else None,
            wheelhouse_host_dir=str(self.wheelhouse),
            wheelhouse_container_dir=WHEELHOUSE_IN_CT,
            state_dir=str(self.state_dir), bin_dir=str(self.bin_dir),
            timings=timings or {},
        )

    # ----------------------------------------------------------------- down
    def release(self, lease: str | None = None) -> bool:
        """Drop a lease; the last one out stops sshd and the containers.
        True when this call stopped the lab."""
        with file_lock(self.lock):
            self._lease_path(lease).unlink(missing_ok=True)
            if self._live_leases():
                return False
            self._stop_all()
            return True

    def down(self) -> None:
        """Stop everything now, whoever holds leases (for people and CI)."""
        with file_lock(self.lock):
            shutil.rmtree(self.leases_dir, ignore_errors=True)
            self._stop_all()

    def destroy(self) -> None:
        """down, then destroy the lab's containers (the template cache stays)."""
        self.down()
        with file_lock(self.lock):
            for ct in self._containers():
                ct.destroy()

    def clear_roots(self, prefix: str = "dfo") -> list[str]:
        """Remove every ``/root/<prefix>*`` directory in the containers this state dir
        manages (the dfo roots tests deploy into: about 1 GB each). Returns what went."""
        gone = []
        with file_lock(self.lock):
            for ct in self._containers():
                home = ct.rootfs / "root"
                for d in sorted(home.glob(f"{prefix}*")) if home.is_dir() else []:
                    if d.is_dir() and not d.is_symlink():
                        shutil.rmtree(d, ignore_errors=True)
                        gone.append(f"{ct.name}:/root/{d.name}")
        return gone

    def status(self) -> dict:
        sshd_pid = self.sshd.pid()
        port = None
        if sshd_pid:
            try:
                port = self.sshd.info().port
            except LabUnavailable:
                pass
        return {
            "state_dir": str(self.state_dir),
            "sshd": {"running": bool(sshd_pid), "pid": sshd_pid, "port": port},
            "containers": {ct.name: ct.state() for ct in self._containers()},
            "pair_network": netns.status(),
            "leases": sorted(self._live_leases()),
        }

    # -------------------------------------------------------------- helpers
    def _container_up(self, ct: Container) -> dict[str, float]:
        t = {}
        t0 = time.monotonic()
        self._own(ct)
        report = ct.build()
        if report.built:
            t["build_s"] = round(report.seconds, 1)
            t["build_from_template_cache"] = report.from_template_cache
        if ct.configure() and ct.running():
            ct.stop()  # the config changed (e.g. another wheelhouse): apply it
        t1 = time.monotonic()
        ct.start()
        t["start_s"] = round(time.monotonic() - t1, 3)
        t["container_total_s"] = round(time.monotonic() - t0, 3)
        return t

    def _own(self, ct: Container) -> None:
        """Record that this state dir manages ``ct`` (only those are stopped)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        owned = set(self._owned())
        if ct.vmid not in owned:
            atomic_write_text(self.state_dir / "containers.json", json.dumps(sorted(owned | {ct.vmid})))

    def _owned(self) -> list[int]:
        try:
            return [int(v) for v in json.loads((self.state_dir / "containers.json").read_text())]
        except (OSError, ValueError, TypeError):
            return []

    def _containers(self) -> list[Container]:
        """The built containers this state dir manages."""
        return [c for c in (Container(v, log_dir=self.logs) for v in self._owned()) if c.exists()]

    def _stop_all(self) -> None:
        self.sshd.down()
        paired = []
        for ct in self._containers():
            ct.stop()
            if netns.uses_pair_net(_read(ct.config), ct.vmid):
                paired.append(ct.vmid)
        if paired:  # only the state dir that runs the pair owns its network namespace
            netns.teardown(paired)  # after the stops: the veth ends are back in the host netns

    def _install_pct(self) -> None:
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.bin_dir / "pct", PCT_SOURCE.read_bytes(), mode=0o755)

    def _lease_path(self, lease: str | None) -> Path:
        return self.leases_dir / (lease or f"pid-{os.getpid()}")

    def _take_lease(self, lease: str | None) -> None:
        self.leases_dir.mkdir(parents=True, exist_ok=True)
        # the start time as /proc shows it (text): the leases of every session compare alike
        data = {"pid": os.getpid(), "start": str(process_start(os.getpid())), "t": time.time()}
        atomic_write_text(self._lease_path(lease), json.dumps(data))

    def _live_leases(self) -> list[str]:
        live = []
        if not self.leases_dir.is_dir():
            return live
        for p in self.leases_dir.iterdir():
            if p.name.startswith("."):
                continue
            if not p.name.startswith("pid-"):  # named leases ("manual") live until down
                live.append(p.name)
                continue
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                d = {}
            start = str(d.get("start"))
            if same_process(d.get("pid"), int(start) if start.isdigit() else None):
                live.append(p.name)
            else:
                p.unlink(missing_ok=True)  # a killed run's lease
        return live


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def info_dict(info: LabInfo) -> dict:
    return asdict(info)
