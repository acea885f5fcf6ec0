"""GPU passthrough facts and problems (plan/gpu.py, plan/gpu_judge.py) on output recorded on
an H200 machine (tests/fixtures/gpu/h200) and edited copies for each failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan import gpu
from orchestrator.plan.gpu_judge import gpu_problems
from orchestrator.plan.probes import Reply

FIX = Path(__file__).parent / "fixtures" / "gpu"


def out(rel: str, code: int = 0) -> Reply:
    return Reply(code, (FIX / rel).read_bytes())


def facts(d: str = "h200", **over) -> gpu.GpuFacts:
    """The H200's facts, with the files of failure directory ``d`` where it has them."""
    def pick(name: str) -> str:
        return f"{d}/{name}" if (FIX / d / name).exists() else f"h200/{name}"
    f = gpu.GpuFacts(
        query=gpu.parse_query(out(pick("query-gpu.csv"))),
        smi=gpu.parse_smi_q(out(pick("nvidia-smi-q.txt"))),
        apps=gpu.parse_apps(out(pick("query-apps.csv"))) or (),
        driver=gpu.parse_driver(out(pick("driver-probe.txt"))),
        devnodes=gpu.parse_devnodes(out(pick("devnodes.txt"))),
        shm=gpu.shm_probe().parse(out(pick("shm-df.txt"))),
    )
    f.memlock_known, f.memlock_kib = gpu.parse_memlock(out(pick("memlock.txt")))
    for k, v in over.items():
        setattr(f, k, v)
    return f


def test_h200_recorded_outputs_parse():
    q = gpu.parse_query(out("h200/query-gpu.csv"))
    assert q.present and q.error is None
    assert q.gpus == (gpu.GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-aa694fa2-111c-4524-7ac7-efa2ec117766",
                                  memory_mib=143771, memory_used_mib=0, driver="580.159.04",
                                  bus_id="00000000:00:06.0", utilization=0, compute_cap="9.0"),)
    s = gpu.parse_smi_q(out("h200/nvidia-smi-q.txt"))
    assert (s.driver, s.cuda, s.attached, s.error) == ("580.159.04", "13.0", 1, None)
    assert gpu.parse_apps(out("h200/query-apps.csv")) == ()
    d = gpu.parse_driver(out("h200/driver-probe.txt"))
    assert d.kernel == "580.159.04" and {v for _, v in d.libraries} == {"580.159.04"}
    n = gpu.parse_devnodes(out("h200/devnodes.txt"))
    assert n.expected_gpus == 1 and [x.state for x in n.nodes] == ["ok"] * 4
    assert [x.major for x in n.nodes] == [195, 195, 238, 238]
    assert gpu.parse_memlock(out("h200/memlock.txt")) == (True, None)


def test_h200_is_healthy_for_gpu_cu130():
    f = facts()
    assert gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0", vmid=200) == []
    assert f.present and f.driver_version == "580.159.04" and f.max_cuda == "13.0"


def test_cpu_profile_on_a_gpu_host_suggests_gpu_cu130():
    p = gpu_problems(facts(), profile="cpu", cuda_runtime=None)
    assert len(p) == 1 and "profile: gpu-cu130" in p[0]


def test_name_with_commas_survives():
    rec = b"3, NVIDIA H200, rev. 2 (fil () &&-@_e), GPU-x, 143771, [N/A], 580.159.04, 0:1.0, [N/A], 9.0\n"
    g = gpu.parse_query(Reply(0, rec)).gpus[0]
    assert (g.index, g.name, g.memory_used_mib, g.utilization) == (3, "NVIDIA H200, rev. 2 (fil () &&-@_e)",
                                                                   None, None)


def test_no_gpu_is_clean():
    f = gpu.GpuFacts(query=gpu.parse_query(Reply(127)), driver=gpu.parse_driver(Reply(3)),
                     devnodes=gpu.parse_devnodes(Reply(0, b"gpus 0\nmissing - /dev/nvidiactl\n"
                                                          b"missing - /dev/nvidia-uvm\n")))
    assert gpu_problems(f, profile="cpu", cuda_runtime=None) == []
    assert not f.present
    p = gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0")
    assert len(p) == 1 and p[0].startswith("no NVIDIA GPU is visible") and "gpu-cu130 needs CUDA 13.0" in p[0]


def test_driver_library_mismatch():
    err = out("mismatch/nvidia-smi.out", 18)
    f = facts("mismatch", query=gpu.parse_query(err), smi=gpu.parse_smi_q(err))
    p = gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0", vmid=200)
    assert len(p) == 1, p
    assert "mismatch: the node's kernel module is 580.159.04, the container's libnvidia-ml is 575.57.08" in p[0]
    assert "NVIDIA-Linux-x86_64-580.159.04.run --no-kernel-module" in p[0]
    # only nvidia-smi's text (no library file found): still named
    f2 = facts(query=gpu.parse_query(err), smi=gpu.parse_smi_q(err),
               driver=gpu.DriverVersions(kernel="580.159.04"))
    assert any("version mismatch" in x for x in gpu_problems(f2, profile="cpu", cuda_runtime=None))


@pytest.mark.parametrize("profile,cuda,want", [
    ("gpu-cu130", "13.0", "needs NVIDIA driver >= 580; the node has 570.133.20"),
    ("gpu-cu128", "12.8", None),
])
def test_driver_too_old_for_the_profile(profile, cuda, want):
    p = gpu_problems(facts("old-driver"), profile=profile, cuda_runtime=cuda, vmid=200)
    if want is None:
        assert p == []
    else:
        assert len(p) == 1 and want in p[0] and "or use profile gpu-cu128" in p[0]


def test_busy_gpu():
    p = gpu_problems(facts("busy"), profile="gpu-cu130", cuda_runtime="13.0")
    assert p == ["GPU 0 (NVIDIA H200) is busy: 1 process(es) (/usr/bin/python3 pid 4242), 40960 of 143771 "
                 "MiB in use (stop what runs there, or leave cuda:0 out of gpus: in hosts.yaml)"]


def test_small_shm_and_low_memlock_with_8_gpus():
    p = gpu_problems(facts("multi-small-shm"), profile="gpu-cu130", cuda_runtime="13.0", vmid=201)
    assert len(p) == 2, p
    assert p[0].startswith("/dev/shm is 64 MiB, too small for NCCL with 8 GPUs")
    assert p[1].startswith("memlock ulimit is 8192 KiB") and "lxc.prlimit.memlock: unlimited" in p[1]
    assert "/etc/pve/lxc/201.conf" in p[1]
    # one GPU: NCCL does not need /dev/shm
    assert len(gpu_problems(facts(d="multi-small-shm", query=facts().query), profile="gpu-cu130",
                            cuda_runtime="13.0")) == 1


def test_device_nodes_missing():
    err = out("devnodes/nvidia-smi.out", 255)
    f = facts(devnodes=gpu.parse_devnodes(out("devnodes/missing.txt")), query=gpu.parse_query(err))
    p = gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0", vmid=200)
    assert len(p) == 1, p
    assert p[0].startswith("GPU device node(s) missing in the container: /dev/nvidia1, /dev/nvidia-uvm, "
                           "/dev/nvidia-uvm-tools (add to /etc/pve/lxc/200.conf on the node: ")
    assert "`lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file`" in p[0]
    assert p[0].endswith("then `pct reboot 200`)")


def test_device_nodes_denied_by_cgroup():
    f = facts(devnodes=gpu.parse_devnodes(out("devnodes/denied.txt")))
    p = gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0", vmid=200)
    assert len(p) == 1, p
    assert "not allowed by the container's cgroup device rules: /dev/nvidia0, /dev/nvidiactl, " \
           "/dev/nvidia-uvm-tools (Operation not permitted)" in p[0]
    assert "`lxc.cgroup2.devices.allow: c 195:* rwm`; `lxc.cgroup2.devices.allow: c 238:* rwm`" in p[0]


def test_nvidia_smi_failure_otherwise_reported():
    f = facts(query=gpu.GpuQuery(present=True, error="No devices were found"))
    assert gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0") == ["nvidia-smi failed: No devices were found"]


def test_scripts_run_here_without_a_gpu():
    """The constant scripts run for real (this machine has no NVIDIA driver): no GPU, no error."""
    from orchestrator.transport import run_probe
    from orchestrator.transport.local import LocalTransport

    t = LocalTransport()
    from orchestrator.engine.hostcheck import gpu_facts
    f = gpu_facts(t)
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    assert gpu_problems(f, profile="cpu", cuda_runtime=None) == [] and not f.present
    assert f.shm is not None and f.memlock_known
    assert run_probe(t, gpu.devnodes_probe()).expected_gpus == 0


@pytest.mark.parametrize("script", ["_QUERY_SCRIPT", "_APPS_SCRIPT", "_SMI_Q_SCRIPT", "_DRIVER_SCRIPT",
                                    "_DEVNODES_SCRIPT"])
def test_probe_scripts_are_shellcheck_clean(script, tmp_path):
    import shutil
    import subprocess

    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    f = tmp_path / "s.sh"
    f.write_text("#!/bin/sh\n" + getattr(gpu, script))
    r = subprocess.run(["shellcheck", "-s", "sh", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_user_space_driver_missing_in_the_container():
    f = facts(query=gpu.parse_query(Reply(127)), smi=gpu.parse_smi_q(Reply(127)), apps=(),
              driver=gpu.parse_driver(Reply(0, (FIX / "h200/proc-driver-version.txt").read_bytes() + b"@@libs\n")))
    p = gpu_problems(f, profile="gpu-cu130", cuda_runtime="13.0", vmid=200)
    assert p == ["the NVIDIA user-space driver is not installed in the container (no libnvidia-ml, no nvidia-smi; "
                 "the node's kernel module is 580.159.04) (install exactly that version's user-space part: "
                 "`sh NVIDIA-Linux-x86_64-580.159.04.run --no-kernel-module`)"]


def test_device_node_permissions_are_not_taken_for_cgroup_rules():
    rec = b"gpus 1\ndenied c3:0 /dev/nvidia0 sh: 1: cannot open /dev/nvidia0: Permission denied\n" \
          b"ok c3:ff /dev/nvidiactl\nok ee:0 /dev/nvidia-uvm\nok ee:1 /dev/nvidia-uvm-tools\n"
    p = gpu_problems(facts(devnodes=gpu.parse_devnodes(Reply(0, rec))), profile="gpu-cu130", cuda_runtime="13.0")
    assert len(p) == 1 and p[0].startswith("GPU device node(s) not readable by this user: /dev/nvidia0")
    assert "cgroup" not in p[0]
