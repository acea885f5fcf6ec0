"""ops.host_load: why tokens/s dropped, from two samples of the host. Pure, no I/O."""

from __future__ import annotations

from orchestrator.ops.host_load import (CpuTimes, GpuApp, HostSample, judge, parse_gpu_apps,
                                        parse_loadavg, parse_proc_stat)

STAT = """cpu  1000 10 500 8000 100 5 5 0 0 0
cpu0 500 5 250 4000 50 2 2 0 0 0
cpu1 500 5 250 4000 50 3 3 0 0 0
intr 12345
ctxt 999
"""


def sample(t, *, user=0, idle=0, steal=0, load=0.5, tree=0.0, ncpu=4):
    return HostSample(t=t, cpu=CpuTimes(user=user, idle=idle, steal=steal), ncpu=ncpu,
                      load1=load, tree_cpu_s=tree)


def test_parsers():
    agg, n = parse_proc_stat(STAT)
    assert n == 2 and agg.user == 1000 and agg.idle == 8000 and agg.iowait == 100
    assert agg.total == 1000 + 10 + 500 + 8000 + 100 + 5 + 5 and agg.idle_all == 8100
    assert parse_proc_stat("garbage")[1] == 0
    assert parse_loadavg("3.52 2.10 1.00 4/300 1234\n") == 3.52
    assert parse_loadavg("") is None
    apps = parse_gpu_apps("1234, python3, 40213, GPU-aaa\n5678, [Not Found], 512, GPU-aaa\n"
                          "No running processes found\n")
    assert apps == [GpuApp(1234, "python3", 40213.0, "GPU-aaa"),
                    GpuApp(5678, "[Not Found]", 512.0, "GPU-aaa")]


def test_a_cpu_hog_next_to_the_run_is_host_busy():
    # 4 cores, 10 s = 4000 ticks (100 Hz): 3000 busy; the run used 1 core -> others 2 cores
    old, new = sample(0.0, tree=0.0), sample(10.0, user=3000, idle=1000, tree=10.0)
    f = judge(old, new, gpu_apps=None)
    assert f.cause == "host_busy" and f.causes == ("host_busy",)
    assert f.seen["other_cores"] == 2.0 and f.seen["run_cores"] == 1.0
    assert "other processes kept 2.0 of 4 cores busy" in f.summary
    assert f.seen["gpu_apps"] == "unknown (no nvidia-smi)"


def test_steal_and_load():
    f = judge(sample(0.0), sample(10.0, user=1000, idle=2600, steal=400, tree=10.0), gpu_apps=[])
    assert f.cause == "host_busy" and "stole 10%" in f.summary
    f = judge(sample(0.0), sample(10.0, user=1000, idle=3000, load=9.0, tree=10.0), gpu_apps=[])
    assert f.cause == "host_busy" and "load 9.0 > 4 cores" in f.summary


def test_the_run_itself_busy_is_not_the_host():
    f = judge(sample(0.0), sample(10.0, user=1600, idle=2400, load=2.0, tree=16.0), gpu_apps=[])
    assert f.cause == "unknown" and f.causes == ()
    assert f.summary == "nothing on the host explains it"


def test_another_process_on_the_gpu_is_gpu_shared():
    apps = [GpuApp(100, "python", 30000.0), GpuApp(200, "other-train", 50000.0)]
    f = judge(sample(0.0), sample(10.0, user=1000, idle=3000, tree=10.0), gpu_apps=apps,
              our_pids={100, 101})
    assert f.cause == "gpu_shared" and "200 other-train" in f.summary
    assert [a["ours"] for a in f.seen["gpu_apps"]] == [True, False]
    # container pid namespace: none of ours listed; one app is probably ours, two are shared
    assert judge(None, None, gpu_apps=[GpuApp(9, "python")], our_pids={100}).cause == "unknown"
    assert judge(None, None, gpu_apps=apps, our_pids={5}).cause == "gpu_shared"


def test_both_causes_are_recorded_gpu_first():
    apps = [GpuApp(100, "python"), GpuApp(200, "x")]
    f = judge(sample(0.0), sample(10.0, user=3000, idle=1000, tree=10.0), gpu_apps=apps,
              our_pids={100})
    assert f.cause == "gpu_shared" and f.causes == ("gpu_shared", "host_busy")
    assert f.to_json()["cause"] == "gpu_shared"


def test_no_window_is_unknown():
    assert judge(None, sample(1.0), gpu_apps=None).cause == "unknown"
    assert judge(sample(1.0), sample(1.0), gpu_apps=None).cause == "unknown"
