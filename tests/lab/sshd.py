"""A real OpenSSH sshd on 127.0.0.1 that plays the Proxmox node.

Everything lives in one directory: a host key and a client key (kept between
runs so known_hosts stays valid), authorized_keys, sshd_config, the PID file,
the log, known_hosts (``[127.0.0.1]:PORT ssh-ed25519 ...``) and an ssh_config
for people (``ssh -F DIR/ssh_config dfo-lab-node``).

The daemon is started detached (so ``python -m tests.lab up`` can leave it
running) and stopped by the PID in its PID file, and only when that PID's
command line names our sshd_config: a stale PID file never kills a stranger.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dfo_contract.fsio import atomic_write_text

from .procs import free_port, kill_pid, pid_matches, read_pid, wait_banner

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_ALIAS = "dfo-lab-node"


class LabUnavailable(RuntimeError):
    """The lab cannot be brought up on this machine (not root, no sshd, no LXC)."""


@dataclass(frozen=True)
class SshdInfo:
    host: str
    port: int
    user: str
    identity_file: str
    known_hosts: str
    ssh_config: str
    host_public_key: str  # "ssh-ed25519 AAAA..."
    pid: int

    def ssh_argv(self, *remote: str) -> list[str]:
        """argv for the OpenSSH client to this node. ``remote`` is what ssh sends
        (ssh joins it with spaces: quote it yourself, e.g. with shlex.join)."""
        return ["ssh", "-F", self.ssh_config, HOST_ALIAS, *remote]


class Sshd:
    def __init__(self, directory: Path, *, path_dirs: list[str] | None = None, user: str = "root"):
        self.dir = Path(directory)
        self.path_dirs = list(path_dirs or [])
        self.user = user
        self.config = self.dir / "sshd_config"
        self.pid_file = self.dir / "sshd.pid"
        self.log = self.dir / "sshd.log"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.client_key = self.dir / "id_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.port_file = self.dir / "port"

    # ------------------------------------------------------------------ state
    def pid(self) -> int | None:
        pid = read_pid(self.pid_file)
        return pid if pid_matches(pid, str(self.config)) else None

    def running(self) -> bool:
        pid = self.pid()
        port = read_pid(self.port_file)
        return bool(pid and port and wait_banner(port, timeout=2.0))

    def info(self) -> SshdInfo:
        pid = self.pid()
        port = read_pid(self.port_file)
        if not (pid and port):
            raise LabUnavailable(f"sshd in {self.dir} is not running")
        return SshdInfo(
            host="127.0.0.1",
            port=port,
            user=self.user,
            identity_file=str(self.client_key),
            known_hosts=str(self.known_hosts),
            ssh_config=str(self.ssh_config),
            host_public_key=self._host_pub(),
            pid=pid,
        )

    # -------------------------------------------------------------- lifecycle
    def up(self) -> tuple[SshdInfo, bool]:
        """Start sshd unless ours is already running. Returns (info, started_now)."""
        self._preflight()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._keys()
        if self.running():
            self._write_client_files(read_pid(self.port_file))
            return self.info(), False
        self.down()  # a stale daemon of ours (wrong state) or leftovers
        last_err = ""
        for _ in range(5):
            port = free_port(read_pid(self.port_file))
            atomic_write_text(self.port_file, f"{port}\n")
            atomic_write_text(self.config, self._config_text(port), mode=0o600)
            self._write_client_files(port)
            self.pid_file.unlink(missing_ok=True)
            proc = subprocess.run(
                [SSHD, "-f", str(self.config), "-E", str(self.log)],
                capture_output=True, text=True, timeout=30,
            )
            if proc.returncode == 0 and self._wait_pid() and wait_banner(port, timeout=10):
                return self.info(), True
            last_err = (proc.stderr.strip() or self._log_tail()).splitlines()[-1:] or ["?"]
            last_err = last_err[0]
            self.down()
            self.port_file.unlink(missing_ok=True)  # pick another port next time
        raise LabUnavailable(f"sshd did not start: {last_err} (see {self.log})")

    def down(self) -> bool:
        """Stop our sshd (by PID, checked against its command line). True if one ran."""
        pid = self.pid()
        if pid:
            kill_pid(pid)
        self.pid_file.unlink(missing_ok=True)
        return bool(pid)

    # ---------------------------------------------------------------- helpers
    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise LabUnavailable("the lab needs root (sshd for root login, LXC)")
        for tool in (SSHD, shutil.which("ssh-keygen") or "ssh-keygen"):
            if not os.path.exists(tool):
                raise LabUnavailable(f"{tool} is missing: apt-get install -y openssh-server")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        _unlock_user(self.user)

    def _keys(self) -> None:
        for key, comment in ((self.host_key, "dfo-lab-host"), (self.client_key, "dfo-lab-client")):
            if not (key.exists() and key.with_suffix(".pub").exists()):
                key.unlink(missing_ok=True)
                key.with_suffix(".pub").unlink(missing_ok=True)
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                    check=True, capture_output=True,
                )
        # readable by the target user (root here, but keep it right for others)
        atomic_write_text(self.authorized_keys, self.client_key.with_suffix(".pub").read_text())

    def _host_pub(self) -> str:
        parts = self.host_key.with_suffix(".pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def _write_client_files(self, port: int) -> None:
        atomic_write_text(self.known_hosts, f"[127.0.0.1]:{port} {self._host_pub()}\n")
        atomic_write_text(
            self.ssh_config,
            f"Host {HOST_ALIAS}\n"
            f"  HostName 127.0.0.1\n"
            f"  Port {port}\n"
            f"  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n"
            f"  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            f"  GlobalKnownHostsFile /dev/null\n"
            f"  StrictHostKeyChecking yes\n"
            f"  BatchMode yes\n"
            f"  ConnectTimeout 10\n",
        )

    def _config_text(self, port: int) -> str:
        path = ":".join([*self.path_dirs, SYSTEM_PATH])
        return (
            f"# dfo test lab: written by tests/lab/sshd.py\n"
            f"Port {port}\n"
            f"ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.pid_file}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PubkeyAuthentication yes\n"
            f"PermitRootLogin prohibit-password\n"
            f"PasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\n"
            f"UsePAM no\n"
            # the state dir may sit under /tmp (world-writable): skip the path checks
            f"StrictModes no\n"
            f"PermitUserEnvironment no\n"
            f"MaxSessions 100\n"
            f"MaxStartups 100:30:200\n"
            f"LogLevel VERBOSE\n"
            f"SetEnv PATH={path}\n"
            f"AcceptEnv LANG LC_*\n"
            f"Subsystem sftp {SFTP_SERVER}\n"
        )

    def _wait_pid(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid():
                return True
            time.sleep(0.02)
        return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip()
        except FileNotFoundError:
            return ""


def _unlock_user(user: str) -> None:
    """With ``UsePAM no`` sshd refuses a user whose password field starts with
    '!' as locked, even for key login; '*' means "no password" and is accepted."""
    try:
        with open("/etc/shadow") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == user:
                    if rest.startswith("!"):
                        subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)
                    return
    except FileNotFoundError:
        return
