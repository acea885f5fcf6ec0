"""Unit tests for the warm-up report parsing and the warm-up argv (orchestrator.engine.cache_warmup)."""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.cache_warmup import WarmResult
from orchestrator.engine.compile_cache import local_snapshot_files
from orchestrator.plan.trainer_warmup import parse_report, warmup_argv, warmup_env, warmup_error_line
from orchestrator.common.errors import CacheError, ConfigError, NotFoundError

REPORT = {  # the shape trainer/train/compile_only.py writes
    "torch": "2.13.0+cpu", "devices": ["cpu"], "buckets": [[32, 4], [64, 4]],
    "records": [
        {"device": "cpu", "shape": [32, 4], "what": "drafter step", "seconds": 20.5,
         "counters": {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2, "autograd_cache_bypass": 1}},
        {"device": "cpu", "shape": [64, 4], "what": "drafter step", "seconds": 9.5,
         "counters": {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2}},
    ],
    "totals": {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 4, "autograd_cache_bypass": 1},
    "seconds": 31.25,
}


def test_parse_report_reads_records_totals_and_seconds():
    recs, totals, secs = parse_report(json.dumps(REPORT))
    assert [r.shape for r in recs] == [[32, 4], [64, 4]]
    assert recs[0].counters["fxgraph_cache_miss"] == 2
    assert totals == {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 4, "autograd_cache_bypass": 1}
    assert secs == 31.25


def test_parse_report_without_totals_sums_records():
    rep = dict(REPORT)
    rep.pop("totals")
    rep.pop("seconds")
    _, totals, secs = parse_report(json.dumps(rep))
    assert totals["fxgraph_cache_miss"] == 4 and secs == 30.0


@pytest.mark.parametrize("bad", ["not json", json.dumps({"nothing": 1}), json.dumps(3),
                                 json.dumps({**REPORT, "records": {"cpu": []}})])
def test_parse_report_refuses_garbage(bad):
    with pytest.raises(CacheError, match="the trainer's warm-up report does not read"):
        parse_report(bad)


def test_the_report_keeps_what_it_does_not_read_and_a_mistyped_shape_field_is_its_default():
    from dfo_contract.replies import WarmupReport

    rep = WarmupReport.from_json({**REPORT, "records": [
        {**REPORT["records"][0], "seconds": "soon"}, REPORT["records"][1]]})
    assert [r.seconds for r in rep.records] == [0.0, 9.5]
    assert rep.extra["buckets"] == [[32, 4], [64, 4]] and rep.extra["torch"] == "2.13.0+cpu"


def test_warmup_argv_is_a_list_with_each_override_one_element():
    argv = warmup_argv("/r/envs/current/bin/python", "/r/c.yaml", [("model.attention", "sdpa; rm -rf /")],
                       "/r/rep.json", save_mega="/r/g/mega/artifacts.bin")
    assert argv == ["/r/envs/current/bin/python", "-m", "trainer", "warmup", "--config", "/r/c.yaml",
                    "--model.attention=sdpa; rm -rf /", "--report", "/r/rep.json",
                    "--save-mega-cache", "/r/g/mega/artifacts.bin"]
    # a value that looks like a flag stays the override's value (one token)
    argv = warmup_argv("py", "c.yaml", [("data.path", "--report=/root/.bashrc")], "/r/rep.json")
    assert "--data.path=--report=/root/.bashrc" in argv and argv[-2:] == ["--report", "/r/rep.json"]
    env = warmup_env("/r/cache/.gens/k-1")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/r/cache/.gens/k-1/inductor"
    assert env["TRITON_CACHE_DIR"] == "/r/cache/.gens/k-1/triton"


def test_warmup_error_line_prefers_the_trainer_error():
    tail = ["Traceback (most recent call last):", "  File x", "RuntimeError: boom", "",
            "trainer: error: boom happened", "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"]
    assert warmup_error_line(tail) == "boom happened"
    assert warmup_error_line(["a", "torch._inductor.exc.InductorError: InvalidCxxCompiler: x", "Set T"]) \
        == "torch._inductor.exc.InductorError: InvalidCxxCompiler: x"
    assert warmup_error_line(["only line"]) == "only line"
    assert warmup_error_line([]) == ""


def test_saved_seconds():
    r = WarmResult(host="h", key="k", action="warmed", cold_s=30.0, warm_s=6.0)
    assert r.saved_s == 24.0 and r.to_json()["saved_s"] == 24.0
    assert WarmResult(host="h", key="k", action="restored").saved_s is None


def test_local_snapshot_files(tmp_path):
    (tmp_path / "k.tar").write_bytes(b"t")
    (tmp_path / "k.manifest.json").write_text("{}")
    assert local_snapshot_files(tmp_path / "k.tar") == (tmp_path / "k.tar", tmp_path / "k.manifest.json")
    assert local_snapshot_files(tmp_path / "k.manifest.json")[0] == tmp_path / "k.tar"
    with pytest.raises(ConfigError):
        local_snapshot_files(tmp_path / "k.zip")
    with pytest.raises(NotFoundError):
        local_snapshot_files(tmp_path / "other.tar")
    (tmp_path / "k.tar").unlink()
    with pytest.raises(CacheError, match="missing"):
        local_snapshot_files(tmp_path / "k.manifest.json")
