"""Probe parsers on recorded output (awkward names included), then the same probes run
for real through the local transport."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from orchestrator.config.inventory import parse_inventory
from orchestrator.ops import probes
from orchestrator.engine.hostcheck import check_host
from orchestrator.transport import LocalTransport, run_probe

AWK = "fil () &&-@_e.txt"


@dataclass
class Out:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""


def test_pct_status():
    assert probes.parse_pct_status(Out(0, b"status: running\n")) == "running"
    assert probes.parse_pct_status(Out(0, b"status: stopped\n")) == "stopped"
    assert probes.parse_pct_status(Out(2, b"", b"Configuration file 'nodes/pve/lxc/200.conf' does not exist\n")) is None
    assert probes.parse_pct_status(Out(0, b"garbage\n")) is None


def test_df_awkward_mount_and_filesystem():
    rec = (b"Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
           b"/dev/mapper/pve-vm--200--disk--0 263174212 49216436 200520976      20% /\n")
    d = probes.parse_df(Out(0, rec))
    assert d == probes.DiskFree(filesystem="/dev/mapper/pve-vm--200--disk--0", mount="/",
                                total_bytes=263174212 * 1024, free_bytes=200520976 * 1024)
    rec = (b"Filesystem 1024-blocks Used Available Capacity Mounted on\n"
           b"my fs (x) 1000 10 990 1% /mnt/" + AWK.encode() + b" 12 34 5% x\n")
    d = probes.parse_df(Out(0, rec))
    assert d.filesystem == "my fs (x)" and d.mount == f"/mnt/{AWK} 12 34 5% x" and d.free_bytes == 990 * 1024
    assert probes.parse_df(Out(1, b"", b"df: /x: No such file or directory\n")) is None


def test_gpus_name_with_commas_and_absent():
    rec = (b"0, GPU-1111, 143771, NVIDIA H200\n"
           b"1, GPU-2222, 143771, NVIDIA H200, rev. 2 (fil () &&-@_e)\n")
    g = probes.parse_gpus(Out(0, rec))
    assert g.present and g.error is None and len(g.gpus) == 2
    assert g.gpus[1] == probes.Gpu(index=1, uuid="GPU-2222", memory_mib=143771,
                                   name="NVIDIA H200, rev. 2 (fil () &&-@_e)")
    assert probes.parse_gpus(Out(127)) == probes.GpuReport(present=False)
    bad = probes.parse_gpus(Out(9, b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"))
    assert bad.present and bad.error.startswith("NVIDIA-SMI has failed")


def test_python_and_init_and_kernel():
    assert probes.parse_python(Out(0, b"3.11.2\n/usr/bin/python3\n")) == probes.PythonInfo("3.11.2", "/usr/bin/python3")
    assert probes.parse_python(Out(127, b"", b"no python3 on PATH\n")) is None
    assert probes.parse_python(Out(0, b"Python 2.7\n")) is None
    assert probes.parse_init(Out(0, b"systemd\n")) == "systemd"
    assert probes.parse_init(Out(1)) is None
    assert probes.parse_kernel(Out(0, b"Linux 6.8.12-4-pve x86_64\n")) == "Linux 6.8.12-4-pve x86_64"


def test_list_dir_nul_separated_names():
    rec = (b"f 12 1700000000.5000000000 " + AWK.encode() + b"\0"
           b"d 4096 1700000001.0000000000 step_10\0"
           b"f 0 1700000002.0000000000 new\nline name\0")
    entries = probes.parse_list_dir(Out(0, rec))
    assert [e.name for e in entries] == [AWK, "new\nline name", "step_10"]
    assert entries[0] == probes.DirEntry(name=AWK, kind="f", size=12, mtime=1700000000.5)
    assert probes.parse_list_dir(Out(1, b"", b"find: '/x': No such file or directory\n")) is None


def test_judge():
    c = probes.judge(probes.HostCheck(host="h", transport="proxmox", target="t", root="/r",
                                      reachable=True, container="stopped"))
    assert c.problems == ["container is stopped"]
    c = probes.judge(probes.HostCheck(host="h", transport="ssh", target="t", root="/r", reachable=True,
                                      disk=probes.DiskFree("fs", "/", 1, 1), init="systemd"))
    assert c.problems[0].startswith("no python3") and c.systemd_pid1 is True


def test_probe_path_must_be_absolute():
    with pytest.raises(ValueError):
        probes.disk_probe("relative")
    with pytest.raises(ValueError):
        probes.list_dir_probe("~/x")


# ----------------------------------------------------------------- real, through the local transport

def test_probes_run_locally_with_awkward_root(tmp_path):
    t = LocalTransport()
    root = tmp_path / AWK / "not yet"  # the root does not exist yet: df walks up
    d = run_probe(t, probes.disk_probe(str(root)))
    st = os.statvfs(tmp_path)
    assert d is not None and d.total_bytes == pytest.approx(st.f_blocks * st.f_frsize, rel=0.01)
    (tmp_path / AWK).mkdir()
    (tmp_path / AWK / "a\nb").write_bytes(b"12345")
    entries = run_probe(t, probes.list_dir_probe(str(tmp_path / AWK)))
    assert [(e.name, e.kind, e.size) for e in entries] == [("a\nb", "f", 5)]
    assert run_probe(t, probes.list_dir_probe(str(tmp_path / "missing"))) is None
    py = run_probe(t, probes.python_probe())
    assert py is not None and py.version[0] == "3"
    assert run_probe(t, probes.gpu_probe()).present in (True, False)


def test_check_host_local(tmp_path):
    inv = parse_inventory(f"hosts:\n  me: {{transport: local, root: '{tmp_path}/{AWK}'}}\n", "h.yaml")
    host = inv.get("me")
    c = check_host(host, LocalTransport("me"))
    assert c.reachable and c.exit_code == 0 and c.error is None
    assert c.python is not None and c.disk is not None and c.init
    js = c.to_json()
    assert js["root"] == f"{tmp_path}/{AWK}" and js["systemd_pid1"] in (True, False)
