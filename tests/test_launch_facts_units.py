"""Pure parts of launch's one round trip (``plan.launch_facts``): sections, the record."""

from __future__ import annotations

import json

import pytest

from dfo_contract.env_fingerprint import EnvFingerprint
from orchestrator.plan.launch_facts import (FactsRequest, facts_argv, parse_facts, parse_record,
                                           record_bytes)
from orchestrator.plan.init_from import INIT_FROM_SCRIPT

S = "a" * 64


def test_sections_parse_into_facts():
    out = "\n".join([
        "@section launch", "systemd=0", "env=1", "lock=held", "lock_owner=r1", "checkpoints=none",
        "@section missing", "/data/x.jsonl",
        "@section stamp", f"stamp\t{S}", "at\t17.5", "holds\t1",
        "@section verified", json.dumps({"probe": {"torch": "2.13.0+cpu"}, "freeze": "a==1\n",
                                          "verified": "now"}),
        "@section state", "current\tcpu-x", "end\tok",
        "@section end"])
    f = parse_facts(out)
    assert f.complete and f.checked and f.holds
    assert f.launch.to_json() == {"systemd": "0", "setsid": "0", "env": "1", "lock": "held",
                                  "lock_owner": "r1", "checkpoints": "none"}
    assert f.missing == ["/data/x.jsonl"]
    assert f.verified.probe == EnvFingerprint(torch="2.13.0+cpu") and f.verified.freeze == "a==1\n"
    assert f.state.current_name == "cpu-x" and f.state.complete_output


def test_the_env_facts_parts_are_typed_and_a_failed_part_stays_in_its_place():
    from orchestrator.plan.launch_facts import checkpoint_listing

    ck = {"name": "step_4", "step": 4, "path": "/c/step_4", "valid": True, "reason": "",
          "run": "r-1"}
    line = {"fingerprint": {"profile": "cpu", "torch": "2.13.0+cpu"},
            "source": {"error": "FileNotFoundError: trainer"},
            "hashes": {"/m/config.json": S, "/m/gone.json": None},
            "checkpoints": {"/c": [ck], "/d": {"error": "PermissionError: /d"}},
            "glob": [["/o/ck-3.pt", 17.5]], "caches": ["cpu-1"]}
    f = parse_facts("@section facts\nwarning: a stray line\n@dfo-facts " + json.dumps(line))
    assert f.answered and f.source_hash is None
    assert f.fingerprint == EnvFingerprint.from_json(line["fingerprint"])
    # a fingerprint.json that does not read is no fingerprint; the other parts still answer
    odd = parse_facts("@section facts\n@dfo-facts " + json.dumps(
        {**line, "fingerprint": {"devices": "none"}}))
    assert odd.answered and odd.fingerprint is None and odd.caches == {"cpu-1"}
    assert f.file_hash("/m/config.json") == S and f.file_hash("/m/gone.json") is None
    assert [c.step for c in checkpoint_listing(f, "/c")] == [4]
    with pytest.raises(ValueError, match="PermissionError: /d"):
        checkpoint_listing(f, "/d")
    with pytest.raises(ValueError, match="/e was not listed"):
        checkpoint_listing(f, "/e")
    assert f.glob_matches() == [("/o/ck-3.pt", 17.5)] and f.caches == {"cpu-1"}
    # an answer that does not read is no answer, and says why; so is none at all
    bad = parse_facts("@section facts\n@dfo-facts " + json.dumps({**line, "glob": "x"}))
    assert not bad.answered and "'glob'" in bad.py_error and bad.glob_matches() == []
    with pytest.raises(ValueError, match="'glob'"):
        checkpoint_listing(bad, "/c")
    old = parse_facts("@section facts\n/usr/bin/python: No module named orchestrator.remote\n")
    assert not old.answered and old.py_error.endswith("No module named orchestrator.remote")


def test_torn_output_is_not_complete_and_no_record_without_holds():
    f = parse_facts("@section launch\nenv=1\n@section stamp\nstamp\t" + S + "\nholds\t0\n")
    assert not f.complete and f.verified is None and f.state is None and f.launch.env == "1"


@pytest.mark.parametrize("text", [
    f"{'b' * 64} 1.0\n" + json.dumps({"probe": {}, "freeze": ""}),   # another stamp
    f"{S} 1.0\n" + "{not json",
    f"{S} 1.0\n" + json.dumps({"probe": {}}),                        # no freeze
    f"{S}\n" + json.dumps({"probe": {}, "freeze": ""}),               # no time
])
def test_a_record_that_is_not_ours_is_ignored(text):
    assert parse_record(text, stamp=S) is None


def test_record_round_trip_and_argv_carries_values_as_parameters():
    b = record_bytes(S, "12.25", EnvFingerprint(torch="x"), "a==1\n", "2026-12-01T00:00:00+00:00")
    r = parse_record(b.decode(), stamp=S)
    assert r.probe == EnvFingerprint(torch="x") and r.freeze == "a==1\n" and r.at == "12.25"
    with pytest.raises(ValueError):
        record_bytes("", "1", EnvFingerprint(), "", "now")
    argv = facts_argv(FactsRequest(root="/r o'ot", run_lock="/r/locks/run.lock",
                                   env_dir="/r/envs/e", python_spec="3.11", wheel="/w.whl",
                                   check=True, paths=["/a b"], ckpt_dirs=["/r/checkpoints/x"],
                                   init_from="/d r'el"))
    assert argv[0:2] == ["bash", "-c"]
    i = argv.index("check")
    assert argv[i:i + 5] == ["check", INIT_FROM_SCRIPT, "/d r'el", "1", "/a b"]
    assert argv[-2:] == ["--ckpt", "/r/checkpoints/x"]
    assert "/r o'ot" in argv and not any("/r o'ot" in a for a in argv[:7])
