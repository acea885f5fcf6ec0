"""The lab's real LXC container: Debian bookworm from ``lxc-create -t debian``,
systemd as PID 1, no network but loopback, a read-only wheelhouse bind mount.

The built container (under lxc.lxcpath, /var/lib/lxc) and the template cache
(/var/cache/lxc/debian) are kept between runs; a warm ``up`` only starts it.
A container counts as built only when its completion marker exists (written
last), so a build killed half-way is destroyed and redone, never used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dfo_contract.fsio import atomic_write_text

from .sshd import LabUnavailable

PREFIX = "dfo-lab-"  # the pct stand-in maps VMID N to the container "dfo-lab-N"
RELEASE = "bookworm"
# g++ and python3-dev: inductor on CPU compiles C++ kernels that include Python.h
# (the warm-cache hit tests and any compile.enabled CPU run in the container need them)
PACKAGES = ["python3", "procps", "util-linux", "tar", "coreutils", "zstd",
            "g++", "python3-dev"]
MARKER = "etc/dfo-lab-release"  # inside the rootfs; written last by build()
LAB_VERSION = "3"
WHEELHOUSE_IN_CT = "/mnt/wheelhouse"
MANAGED_BEGIN = "# --- dfo-lab managed (tests/lab/container.py) ---"
MANAGED_END = "# --- end dfo-lab managed ---"
APT_PACKAGES = "openssh-server lxc lxc-templates debootstrap distro-info rsync"


@dataclass(frozen=True)
class BuildReport:
    name: str
    built: bool  # False: it existed already
    seconds: float
    from_template_cache: bool


class Container:
    def __init__(self, vmid: int, *, wheelhouse: Path | None = None, log_dir: Path | None = None,
                 net: list[str] | None = None):
        self.vmid = int(vmid)
        self.net = list(net or [])  # extra lxc.net.1.* lines (the pair network, tests/lab/pair.py)
        self.name = f"{PREFIX}{self.vmid}"
        self.wheelhouse = Path(wheelhouse).resolve() if wheelhouse else None
        self.log_dir = Path(log_dir) if log_dir else None
        self.lxcpath = Path(_lxc_config("lxc.lxcpath") or "/var/lib/lxc")

    # ------------------------------------------------------------------ paths
    @property
    def dir(self) -> Path:
        return self.lxcpath / self.name

    @property
    def config(self) -> Path:
        return self.dir / "config"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"

    # ------------------------------------------------------------------ state
    def exists(self) -> bool:
        return self.config.exists()

    def built(self) -> bool:
        marker = self.rootfs / MARKER
        return self.exists() and marker.exists() and marker.read_text().strip() == LAB_VERSION

    def state(self) -> str:
        """RUNNING, STOPPED, ... or MISSING."""
        if not self.exists():
            return "MISSING"
        p = subprocess.run(["lxc-info", "-n", self.name, "-s", "-H"], capture_output=True, text=True)
        return p.stdout.strip() or "STOPPED"

    def running(self) -> bool:
        return self.state() == "RUNNING"

    # -------------------------------------------------------------- lifecycle
    def build(self) -> BuildReport:
        """Create the container unless a complete one exists."""
        preflight()
        if self.built():
            return BuildReport(self.name, False, 0.0, True)
        if self.exists():  # half-built leftover of a killed run
            self.destroy()
        cached = (Path("/var/cache/lxc/debian") / f"rootfs-{RELEASE}-amd64").exists()
        t0 = time.monotonic()
        create_conf = self.dir.parent / f".{self.name}.create.conf"
        create_conf.parent.mkdir(parents=True, exist_ok=True)
        create_conf.write_text("lxc.net.0.type = empty\nlxc.apparmor.profile = unconfined\n")
        log = self._log("create")
        cmd = ["lxc-create", "-n", self.name, "-f", str(create_conf), "-t", "debian", "--",
               "-r", RELEASE, f"--packages={','.join(PACKAGES)}"]
        with open(log, "wb") as out:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        create_conf.unlink(missing_ok=True)
        if p.returncode != 0:
            self.destroy()
            raise LabUnavailable(f"lxc-create {self.name} failed (exit {p.returncode}); see {log}")
        # The template exits 0 even when it skipped the extra packages.
        if not (self.rootfs / "usr/bin/python3").exists():
            self.destroy()
            raise LabUnavailable(f"lxc-create {self.name} did not install python3 "
                                 f"(is distro-info installed?); see {log}")
        self._provision()
        (self.rootfs / MARKER).write_text(LAB_VERSION + "\n")  # last: the build is complete
        return BuildReport(self.name, True, time.monotonic() - t0, cached)

    def configure(self) -> bool:
        """Write the managed part of the LXC config. True when it changed."""
        text = self.config.read_text()
        lines = text.splitlines()
        if MANAGED_BEGIN in lines:
            i, j = lines.index(MANAGED_BEGIN), lines.index(MANAGED_END)
            base = lines[:i] + lines[j + 1:]
        else:
            base = lines
        managed = [MANAGED_BEGIN,
                   "lxc.net.0.type = empty",
                   "lxc.apparmor.profile = unconfined",
                   "lxc.start.auto = 0",
                   *self.net]
        if self.wheelhouse:
            if any(c.isspace() for c in str(self.wheelhouse)):
                raise LabUnavailable(f"wheelhouse path must not contain spaces: {self.wheelhouse}")
            self.wheelhouse.mkdir(parents=True, exist_ok=True)
            # like a Proxmox mpN mount point, read-only
            managed.append(f"lxc.mount.entry = {self.wheelhouse} {WHEELHOUSE_IN_CT.lstrip('/')} "
                           f"none bind,ro,create=dir 0 0")
        managed.append(MANAGED_END)
        # drop base lines that the managed block overrides (lxc-create wrote them)
        keys = {m.split("=", 1)[0].strip() for m in managed[1:-1] if "=" in m}
        keys.discard("lxc.mount.entry")
        base = [ln for ln in base if ln.split("=", 1)[0].strip() not in keys
                and not ln.strip().startswith("lxc.net.")]  # the network is ours alone
        new = "\n".join(base).rstrip("\n") + "\n\n" + "\n".join(managed) + "\n"
        if new == text:
            return False
        atomic_write_text(self.config, new)
        return True

    def start(self, *, wait_systemd: float = 15.0) -> bool:
        """Start unless running. True when started now."""
        if self.running():
            return False
        log = self._log("start")
        p = subprocess.run(["lxc-start", "-n", self.name, "-o", str(log), "-l", "INFO"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise LabUnavailable(f"lxc-start {self.name} failed: {p.stderr.strip() or '?'} (see {log})")
        subprocess.run(["lxc-wait", "-n", self.name, "-s", "RUNNING", "-t", "30"], capture_output=True)
        self.wait_systemd(wait_systemd)
        return True

    def wait_systemd(self, timeout: float) -> str:
        """Wait until systemd (PID 1) has finished booting; returns its state."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            p = self.attach(["systemctl", "is-system-running"], timeout=10)
            state = p.stdout.decode().strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.1)
        raise LabUnavailable(f"systemd in {self.name} did not finish booting: {state}")

    def stop(self) -> bool:
        """Stop (immediately) if running. True when it was running."""
        if not self.running():
            return False
        subprocess.run(["lxc-stop", "-n", self.name, "-k"], capture_output=True)
        subprocess.run(["lxc-wait", "-n", self.name, "-s", "STOPPED", "-t", "30"], capture_output=True)
        return True

    def destroy(self) -> None:
        if not self.exists() and not self.dir.exists():
            return
        self.stop()
        p = subprocess.run(["lxc-destroy", "-n", self.name], capture_output=True, text=True)
        if p.returncode != 0 and self.dir.exists():
            shutil.rmtree(self.dir)

    def attach(self, argv: list[str], *, timeout: float = 60, stdin: bytes | None = None):
        """Run argv in the container (lxc-attach --clear-env); CompletedProcess with bytes."""
        return subprocess.run(["lxc-attach", "-n", self.name, "--clear-env", "--", *argv],
                              input=stdin if stdin is not None else b"", capture_output=True,
                              timeout=timeout)

    # ---------------------------------------------------------------- helpers
    def _provision(self) -> None:
        root = self.rootfs
        # no network but loopback: keep ifupdown from failing on a missing eth0
        (root / "etc/network/interfaces").write_text(
            "# dfo test lab: loopback only (lxc.net.0.type = empty)\n"
            "auto lo\niface lo inet loopback\n")
        (root / "mnt/wheelhouse").mkdir(parents=True, exist_ok=True)

    def _log(self, what: str) -> Path:
        d = self.log_dir or Path("/tmp")
        d.mkdir(parents=True, exist_ok=True)
        return d / f"lxc-{self.name}-{what}.log"


def _lxc_config(key: str) -> str:
    try:
        p = subprocess.run(["lxc-config", key], capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return p.stdout.strip()


def preflight() -> None:
    """Raise LabUnavailable (with the fix) when LXC cannot work here."""
    if os.geteuid() != 0:
        raise LabUnavailable("the LXC lab needs root")
    missing = [t for t in ("lxc-create", "lxc-start", "lxc-attach", "debootstrap", "distro-info")
               if not shutil.which(t)]
    if missing:
        raise LabUnavailable(f"missing {', '.join(missing)}: apt-get install -y {APT_PACKAGES}")
    if not Path("/usr/share/lxc/templates/lxc-debian").exists():
        raise LabUnavailable(f"the LXC debian template is missing: apt-get install -y {APT_PACKAGES}")
