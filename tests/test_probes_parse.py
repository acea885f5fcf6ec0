"""Probe parsers on recorded output (awkward names included), then the same probes run
for real through the local transport."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from dfo_contract.status import QueryReply, StopReply
from orchestrator.common.errors import RemoteCommandError
from orchestrator.config.inventory import parse_inventory
from orchestrator.plan import gpu, probes
from orchestrator.engine.hostcheck import check_host
from orchestrator.transport import LocalTransport, proxmox, run_probe

AWK = "fil () &&-@_e.txt"


@dataclass
class Out:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""


def test_pct_status():
    assert proxmox.parse_pct_status(Out(0, b"status: running\n")) == "running"
    assert proxmox.parse_pct_status(Out(0, b"status: stopped\n")) == "stopped"
    assert proxmox.parse_pct_status(Out(2, b"", b"Configuration file 'nodes/pve/lxc/200.conf' does not exist\n")) is None
    assert proxmox.parse_pct_status(Out(0, b"garbage\n")) is None


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
    rec = (b"0, NVIDIA H200, GPU-1111, 143771, 0, 580.1, 0:1.0, 0, 9.0\n"
           b"1, NVIDIA H200, rev. 2 (fil () &&-@_e), GPU-2222, 143771, 0, 580.1, 0:2.0, 0, 9.0\n")
    g = gpu.gpu_report(gpu.parse_query(Out(0, rec)))
    assert g.present and g.error is None and len(g.gpus) == 2
    assert g.gpus[1] == probes.Gpu(index=1, uuid="GPU-2222", memory_mib=143771,
                                   name="NVIDIA H200, rev. 2 (fil () &&-@_e)")
    assert gpu.gpu_report(gpu.parse_query(Out(127))) == probes.GpuReport(present=False)
    bad = gpu.gpu_report(gpu.parse_query(
        Out(9, b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")))
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
    assert run_probe(t, gpu.query_probe()).present in (True, False)


def test_check_host_local(tmp_path):
    inv = parse_inventory(f"hosts:\n  me: {{transport: local, root: '{tmp_path}/{AWK}'}}\n", "h.yaml")
    host = inv.get("me")
    c = check_host(host, LocalTransport("me"))
    assert c.reachable and c.exit_code == 0 and c.error is None
    assert c.python is not None and c.disk is not None and c.init
    js = c.to_json()
    assert js["root"] == f"{tmp_path}/{AWK}" and js["systemd_pid1"] in (True, False)


# ----------------------------------------------------------------- every Probe, on recorded output

UNI = "dätä 'q' \"dq\" — ✓"  # spaces, quotes, unicode


def _b64(s: str) -> str:
    import base64

    return base64.b64encode(s.encode()).decode()


def test_probe_parse_output_takes_text_or_bytes():
    p = probes.kernel_probe()
    assert p.parse_output("Linux 6.8 x86_64\n") == "Linux 6.8 x86_64"
    assert p.parse_output(b"", b"uname: not found", 127) is None
    assert probes.Reply(stdout=b"x").exit_code == 0


def test_gpus_unicode_and_quoted_names():
    rec = ('0, NVIDIA H200 "SXM", 141 GB — ✓, GPU-aa, 143771, 0, 580.1, 0:1.0, 0, 9.0\n'
           "1, Tesla ü, GPU-bb, [N/A], [N/A], 580.1, 0:2.0, [N/A], [N/A]\n").encode()
    r = gpu.query_probe().parse_output(rec)
    assert [g.name for g in r.gpus] == ['NVIDIA H200 "SXM", 141 GB — ✓', "Tesla ü"]
    assert r.gpus[1].memory_mib is None and r.error is None


def test_list_dir_unicode_and_invalid_utf8():
    rec = b"f 3 1.0 " + UNI.encode() + b"\0" + b"f 1 2.0 bad\xffname\0"
    entries = probes.parse_list_dir(probes.Reply(0, rec))
    assert {e.name for e in entries} == {UNI, "bad\udcffname"}


def test_launch_probe_recorded():
    p = probes.launch_probe(f"/r/{UNI}", f"/r/{UNI}/locks/run.lock")
    assert p.argv[:4] == ("sh", "-c", probes.LAUNCH_PROBE_SCRIPT, "dfo-probe")
    assert p.argv[4:] == (f"/r/{UNI}", f"/r/{UNI}/locks/run.lock")  # values stay argv elements
    d = p.parse_output("systemd=0\nsetsid=1\nenv=1\nlock=held\nlock_owner=run-a=b\nnoise\n")
    assert d.to_json() == {"systemd": "0", "setsid": "1", "env": "1", "lock": "held",
                           "lock_owner": "run-a=b"}


def test_query_and_stop_replies():
    q = probes.query_probe("/r/envs/current/bin/python", f"/r/{UNI}", run="r1")
    assert q.argv[-2:] == ("--run", "r1") and f"/r/{UNI}" in q.argv
    reply = {"runs": [{"run_id": "r1", "run_dir": f"/r/{UNI}/runs/r1"}], "lock_owner": None}
    out = "WARNING: a warning from the env {not json}\n" + json.dumps(reply) + "\n\n"
    assert q.parse_output(out) == QueryReply.from_json(reply)
    assert q.parse_output(json.dumps(reply, ensure_ascii=False)) == QueryReply.from_json(reply)
    assert q.parse_output(out).runs[0].run_dir == f"/r/{UNI}/runs/r1"
    with pytest.raises(RemoteCommandError, match="not JSON"):
        q.parse_output("Traceback (most recent call last):\n  ...\n")
    with pytest.raises(RemoteCommandError, match="stopping the run"):
        probes.stop_probe("py", "/r", "r1").parse_output("[1, 2]\n")  # JSON, but not an object
    assert probes.stop_probe("py", "/r", "r1").parse_output('{"stopped": true}') == \
        StopReply(stopped=True)


DEV = {"index": 0, "name": UNI, "capability": "9.0"}


def test_state_probe_recorded_awkward():
    owner = json.dumps({"run_id": "r-ü", "pid": 7})
    lease = "tokA " + json.dumps({"user": UNI, "machine": "m"}, ensure_ascii=False)
    rec = "\n".join([
        "arch\tx86_64", "uv\tuv 0.9.0 (abc)", f"current\t/r/{UNI}/envs/cpu-a", "previous\t",
        "target\tincomplete", f"current_fingerprint\t{_b64(json.dumps({'devices': [DEV]}))}",
        f"current_freeze\t{_b64('torch==2.13.0' + chr(10))}", f"python\t/opt/{UNI}/bin/python3",
        "df_kb\t12345", "wheel\tabsent", "run_lock\theld", f"run_lock_owner\t{_b64(owner)}",
        f"deploy_owner\t{_b64(lease)}", "deploy_owner_age\t-3", "env\tcomplete cpu-a",
        "env\tincomplete cpu b", "end\tok"]) + "\n"
    from orchestrator.plan import deploy_plan as dp

    s = dp.state_probe(f"/r/{UNI}", "/r/e", "3.11", "/r/w.whl").parse_output(rec)
    assert s.complete_output and s.current_name == "cpu-a" and s.previous_name == ""
    assert s.current_fingerprint is not None and s.current_fingerprint.devices[0].name == UNI
    assert s.current_fingerprint.to_json()["devices"] == [DEV]
    assert s.python == f"/opt/{UNI}/bin/python3" and s.df_kb == 12345
    assert s.run_lock_held and dp.describe_run_lock(s.run_lock_owner) == "run r-ü (pid 7)"
    assert s.deploy_owner == lease and s.deploy_owner_age == -3
    assert UNI in dp.describe_lease(s.deploy_owner)
    assert s.envs == {"cpu-a": True, "cpu b": False}
    assert not dp.state_probe("/r", "/e", "3", "/w").parse_output("arch\tx86_64\n", "", 1).complete_output


def test_env_probe_recorded_awkward():
    from orchestrator.common.errors import DeployError
    from dfo_contract.env_fingerprint import EnvFingerprint
    from orchestrator.plan import fingerprint as fpm

    fp = {"torch": "2.13.0", "devices": [{"index": 0, "name": UNI, "capability": "9.0"}],
          "errors": {"trainer": "ImportError: no module named 'träiner'"}}
    p = fpm.env_probe("/r/envs/x/bin/python")
    assert p.env and p.env["CUDA_MODULE_LOADING"] == "LAZY" and p.argv[1] == "-c"
    out = "noise before\n" + fpm.PROBE_MARK + json.dumps(fp, ensure_ascii=False) + "\n"
    assert p.parse_output(out, "a warning on stderr\n") == EnvFingerprint.from_json(fp)
    # the marker on stderr (a python that prints there) still counts
    assert p.parse_output("", fpm.PROBE_MARK + json.dumps(fp)) == EnvFingerprint.from_json(fp)
    with pytest.raises(DeployError, match="printed no result: ModuleNotFoundError: ü"):
        p.parse_output("", "ModuleNotFoundError: ü\n", 1)


def test_cache_tool_reply_recorded_awkward():
    from orchestrator.common.errors import CacheError
    from orchestrator.plan import snapshot as sn

    from dfo_contract.cache_records import FileDigest, HashDirReply

    files = {f"inductor/{UNI}/f": {"sha256": "0" * 64, "size": 1}}
    p = sn.tool_probe("python3", "hashdir", f"/r/{UNI}", reply=HashDirReply)
    assert p.argv[-2:] == ("hashdir", f"/r/{UNI}")
    out = "warning: something\n" + json.dumps({"files": files, "other": [UNI]}) + "\n"
    assert p.parse_output(out).files == {f"inductor/{UNI}/f": FileDigest(sha256="0" * 64, size=1)}
    with pytest.raises(CacheError, match="printed no result"):
        p.parse_output('{"error": "unknown op x"}\n')
    with pytest.raises(CacheError, match="cache helper hashdir"):
        p.parse_output("Traceback ...\n{broken\n")


def test_source_hash_reply_recorded_awkward():
    from orchestrator.plan import cache_key as ck

    hashes = {f"trainer/{UNI}.py": "a" * 64, "dfo_contract/fsio.py": "b" * 64}
    p = ck.source_hash_probe("/r/envs/current/bin/python")
    assert p.argv[1:] == ("-m", ck.SOURCE_HASH_MODULE, "trainer", "dfo_contract")
    assert p.parse_output("note\n" + json.dumps(hashes, ensure_ascii=False)) == ck.source_hash(hashes)
    assert p.parse_output('{"error": "package dfo_contract not found"}', "", 3) is None
    assert p.parse_output("") is None and p.parse_output("{}") is None


def test_probe_modules_do_no_io():
    """plan/ is pure: these modules neither open files nor run processes (the one exception,
    reading a shipped script's text, lives in plan/scripts/__init__.py)."""
    import ast
    from pathlib import Path

    from orchestrator.config import lockfile

    ops = Path(probes.__file__).parent
    for name in ("probes", "fingerprint", "snapshot", "cache_key", "deploy_plan", "drift", "lockfile"):
        tree = ast.parse((Path(lockfile.__file__) if name == "lockfile" else ops / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not {m.split(".")[0] for m in mods} & {"os", "subprocess", "shutil", "pathlib",
                                                             "socket", "io", "importlib"}, (name, mods)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "open", name
