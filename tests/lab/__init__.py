"""The dfo test lab: real parts, no mocks (see docs/testing.md).

* a real OpenSSH sshd on 127.0.0.1 (a free port) that plays the Proxmox node:
  root login by key only, temporary host and client keys, known_hosts with
  ``[127.0.0.1]:PORT``; its sessions have the lab's ``bin/`` (holding ``pct``)
  first on PATH;
* a real LXC container ``dfo-lab-200`` (VMID 200): Debian bookworm from
  ``lxc-create -t debian``, systemd as PID 1, no network but loopback,
  python3 (3.11), procps, util-linux, tar, coreutils, zstd; the host dir
  ``<state>/wheelhouse`` bind-mounted read-only at ``/mnt/wheelhouse`` (like a
  Proxmox mpN mount point);
* a ``pct`` stand-in (tests/lab/pct, bash) with Proxmox's semantics:
  ``exec VMID [--keep-env 0|1] -- ARGV`` (``exec lxc-attach``; keep-env
  defaults to 1 as in PVE 8), ``status``, ``start``, ``stop``, ``push``,
  ``pull``, ``list``; unknown VMID -> "Configuration file
  'nodes/NODE/lxc/VMID.conf' does not exist", exit 2;
* a scratch container ``dfo-lab-201`` that tests may stop and start
  (``Lab.scratch()``, fixture ``lab_scratch``); never stop 200 in a test, other
  sessions share it.

* the pair (tests/lab/pair.py, netns.py): containers ``dfo-lab-202`` (head,
  10.77.0.1) and ``dfo-lab-203`` (10.77.0.2), built like 200, each with ``mn0``
  on bridge ``br0`` inside the lab's own network namespace ``dfo-lab-mn`` (fixture
  ``lab_pair``; ``Pair(lab).up() -> PairInfo``, idempotent; torn down with the lab).

For people: ``python -m tests.lab up [--pair]|down|status|destroy [--json]``.

Stable API for tests (needs root; the fixtures in tests/conftest.py wrap it)::

    from tests.lab import Lab, LabInfo, LabUnavailable

    lab = Lab(state_dir=None, vmid=200)   # state dir: $DFO_LAB_DIR or /var/lib/dfo-lab
    info = lab.up(container=True)        # -> LabInfo; takes a lease (this PID)
    lab.release()                         # drop the lease; the last one stops it all
    lab.down()                            # stop sshd + containers now (they stay built)
    lab.status()                          # -> dict
    lab.scratch()                         # -> Container 201 (built; any state)

    LabInfo fields: ssh_host ("127.0.0.1"), ssh_port, ssh_user ("root"),
      identity_file, known_hosts, ssh_config (Host "dfo-lab-node"),
      host_public_key ("ssh-ed25519 AAAA..."), vmid (200, or None without the
      container), container_name ("dfo-lab-200"), wheelhouse_host_dir,
      wheelhouse_container_dir ("/mnt/wheelhouse"), state_dir, bin_dir, timings
    info.hosts_yaml(root="/root/dfo", node_root=None) -> str: hosts "lab"
      (transport proxmox, vmid) and "lab-node" (transport ssh, root under the
      state dir), both with ssh.identity_file and ssh.known_hosts set.
    info.ssh_argv(*remote) -> ["ssh", "-F", ssh_config, "dfo-lab-node", *remote]

    Sshd(directory, path_dirs=[...]).up() -> (SshdInfo, started): an extra,
      independent sshd (e.g. one without pct on PATH); stop it with .down().

pytest fixtures (tests/conftest.py): ``lab`` (session; LabInfo with the
container), ``sshd_only`` (session; LabInfo without starting the container),
``lab_hosts_file`` (a tmp hosts.yaml path), ``lab_hosts_factory``,
``lab_scratch`` (Container 201, held exclusively during the test),
``make_sshd`` (factory for extra sshds, stopped at test end), ``lab_pair``
(PairInfo of 202+203 on the pair network, held exclusively). Without root or
LXC they skip, unless CI is set: then a lab that cannot come up fails.
"""

from .container import WHEELHOUSE_IN_CT, Container
from .lab import DEFAULT_VMID, SCRATCH_VMID, Lab, LabInfo, default_state_dir
from .sshd import LabUnavailable, Sshd, SshdInfo

__all__ = [
    "Container", "DEFAULT_VMID", "Lab", "LabInfo", "LabUnavailable", "SCRATCH_VMID",
    "Sshd", "SshdInfo", "WHEELHOUSE_IN_CT", "default_state_dir",
]
