"""The records of a run's files and the follow wire, read and written by the codec: the
supervisor's heartbeat (``dfo_contract.beat``), the follow wire (``dfo_contract.wire``), a
checkpoint's manifest and ``list --json`` entry (``dfo_contract.checkpoints``), the notice of a
read-only run directory (``supervisor.runfiles``) and the group store's decision
(``dfo_contract.group_store``). Each round-trips, writes the bytes of the samples under
tests/fixtures/ key for key, and refuses what is not one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dfo_contract import beat, events, wire
from dfo_contract import checkpoints as cm
from dfo_contract import group_store as gs
from dfo_contract.cache_records import FileDigest
from dfo_contract.errors import ContractError, VersionError
from dfo_contract.state_records import CheckpointRef, EvidenceLine
from orchestrator.supervisor import runfiles

FIXTURES = Path(__file__).parent / "fixtures"


# --- supervisor.beat -------------------------------------------------------------------------

BEAT = beat.Beat(pid=4242, mono=123456.789, t=1700000000.125, every_s=1.0, silent_s=30.0)


def test_a_heartbeat_round_trips_and_writes_the_samples_bytes(tmp_path):
    raw = (FIXTURES / "beat" / "supervisor.beat").read_text()
    assert json.dumps(BEAT.to_json()) == raw     # as the supervisor's beat thread writes it
    assert beat.Beat.from_json(json.loads(raw)) == BEAT
    assert beat.Beat.from_json(BEAT.to_json()) == BEAT
    (tmp_path / beat.BEAT_FILE).write_text(raw)
    assert beat.read_beat(str(tmp_path), 4242) == BEAT
    assert beat.read_beat(str(tmp_path), 4243) is None       # another supervisor's


def test_a_heartbeat_that_is_not_one_is_refused(tmp_path):
    good = BEAT.to_json()
    for bad, needle in (([1], "a heartbeat is not a JSON object"),
                        ({k: v for k, v in good.items() if k != "mono"},
                         "a heartbeat lacks its 'mono' field"),
                        ({**good, "pid": "4242"}, "a heartbeat's 'pid' is str '4242'")):
        with pytest.raises(ValueError, match=needle):
            beat.Beat.from_json(bad)
    assert beat.Beat.from_json({k: v for k, v in good.items() if k != "version"}) == BEAT
    (tmp_path / beat.BEAT_FILE).write_text(json.dumps({**good, "t": "now"}))
    assert beat.read_beat(str(tmp_path), 4242) is None


# --- the follow wire -------------------------------------------------------------------------

WIRE_RECORDS = [wire.Line("attempt-2.log", 1234, "text"),
                wire.Line("attempt-3.log", 17, "again \u00e9 \"quoted\"\ttab", restart=True),
                wire.Line("events.jsonl", 0, ""),
                wire.End(wire.NEVER_STARTED), wire.End("done"),
                wire.Eof(None), wire.Eof("failed"),
                wire.Keepalive(), wire.Error("no run directory /x")]


def test_the_wire_records_write_the_samples_bytes_and_read_back():
    lines = (FIXTURES / "wire" / "records.jsonl").read_text().splitlines()
    assert [wire.encode(r) for r in WIRE_RECORDS] == lines
    assert [wire.decode(x) for x in lines] == WIRE_RECORDS


def test_a_wire_record_with_a_mistyped_field_is_not_a_record():
    assert wire.decode('{"f": "a.log", "o": 3}') == wire.Line("a.log", 3, "")
    assert wire.decode('{"eof": true}') == wire.Eof(None)
    assert wire.decode('{"f": "a.log", "o": 3, "l": "x", "r": true}').restart
    for stray in ('{"f": 5, "o": 3, "l": "x"}', '{"f": "a.log", "o": 3, "l": null}',
                  '{"f": "a.log", "o": 3, "l": "x", "r": "yes"}', '{"end": 5}',
                  '{"eof": true, "status": 3}', '{"error": ["x"]}'):
        assert wire.decode(stray) is None, stray
    with pytest.raises(ContractError, match="not a follow wire record"):
        wire.encode(object())  # type: ignore[arg-type]


# --- checkpoints -----------------------------------------------------------------------------

def _ckpt_files(d: Path) -> None:
    """The files the fixture manifests were written over."""
    for i, n in enumerate(cm.REQUIRED_FILES):
        (d / n).write_bytes(f"{n} contents {i}\n".encode() * (i + 1))


@pytest.mark.parametrize("fixture, step, lineage, run", [
    ("manifest.json", 40, {"run": "r-20240101-abc", "attempt": 3}, "r-20240101-abc"),
    ("manifest-no-lineage.json", 7, None, None),
    ("manifest-lineage-no-run.json", 8, {"attempt": 2}, None),
])
def test_a_manifest_writes_the_samples_bytes_and_verifies(tmp_path, fixture, step, lineage, run):
    _ckpt_files(tmp_path)
    man = cm.write_manifest(str(tmp_path), step, list(cm.REQUIRED_FILES), lineage=lineage)
    raw = (FIXTURES / "checkpoints" / fixture).read_bytes()
    assert (tmp_path / cm.MANIFEST).read_bytes() == raw
    rec = cm.CheckpointManifest.from_json(json.loads(raw))
    assert rec.to_json() == man == json.loads(raw) and rec.step == step
    assert rec.files["rng.pt"] == FileDigest(sha256=man["files"]["rng.pt"]["sha256"],
                                             size=man["files"]["rng.pt"]["size"])
    assert (rec.lineage is None) == (lineage is None)
    assert cm.verify(str(tmp_path), expect_step=step) == (True, "")
    assert cm.manifest_run(str(tmp_path)) == run


def test_verify_says_why_a_manifest_does_not_do(tmp_path):
    _ckpt_files(tmp_path)
    good = cm.write_manifest(str(tmp_path), 5, list(cm.REQUIRED_FILES),
                             lineage={"run": "r1", "attempt": 1})
    files = good["files"]

    def says(man, **kw):
        (tmp_path / cm.MANIFEST).write_text(json.dumps(man))
        return cm.verify(str(tmp_path), **kw)

    assert says(good, expect_step=6) == (False, "manifest says step 5, directory says step 6")
    assert says({**good, "files": {k: v for k, v in files.items() if k != "optim.pt"}}) == \
        (False, "manifest lacks optim.pt")
    assert says({**good, "files": {**files, "rng.pt": {**files["rng.pt"], "size": 1}}}) == \
        (False, f"rng.pt has {files['rng.pt']['size']} bytes, manifest says 1 (truncated?)")
    assert says({**good, "files": {**files, "rng.pt": {**files["rng.pt"], "sha256": "0"}}}) == \
        (False, "rng.pt sha256 mismatch (corrupt)")
    assert says({**good, "files": {**files, "rng.pt": {**files["rng.pt"], "sha256": "0"}}},
                check_hashes=False) == (True, "")
    for bad in ([1], {**good, "format": 2}, {**good, "files": []},
                {k: v for k, v in good.items() if k != "format"},
                {**good, "files": {**files, "rng.pt": {"size": "1"}}}):
        assert says(bad) == (False, "manifest.json has an unknown format")
    assert says({k: v for k, v in good.items() if k != "lineage"}) == (True, "")
    (tmp_path / cm.MANIFEST).write_text("{torn")
    assert cm.verify(str(tmp_path)) == (False, "manifest.json unreadable (JSONDecodeError)")
    assert cm.manifest_run(str(tmp_path)) is None
    (tmp_path / cm.MANIFEST).unlink()
    assert cm.verify(str(tmp_path)) == (False, "no manifest.json (torn: the save did not finish)")


def test_a_manifest_record_refuses_another_format_and_a_mistyped_field():
    raw = json.loads((FIXTURES / "checkpoints" / "manifest.json").read_text())
    with pytest.raises(VersionError, match="manifest.json of format 2: this dfo reads format 1"):
        cm.CheckpointManifest.from_json({**raw, "format": 2})
    with pytest.raises(ContractError, match="manifest.json's 'lineage.attempt' is str"):
        cm.CheckpointManifest.from_json({**raw, "lineage": {"run": "r", "attempt": "3"}})
    with pytest.raises(ContractError, match="manifest.json lacks its 'step' field"):
        cm.CheckpointManifest.from_json({k: v for k, v in raw.items() if k != "step"})


def test_manifest_run_reads_the_lineage_of_a_manifest_that_does_not_verify(tmp_path):
    (tmp_path / cm.MANIFEST).write_text(json.dumps({"lineage": {"run": "r9"}}))
    assert cm.manifest_run(str(tmp_path)) == "r9"
    for lineage in ("r9", {"run": 9}, {"run": ""}):
        (tmp_path / cm.MANIFEST).write_text(json.dumps({"lineage": lineage}))
        assert cm.manifest_run(str(tmp_path)) is None


def test_a_listing_entry_writes_the_samples_bytes_and_reads_back():
    infos = [cm.CkptInfo("step_40", 40, "/ck/step_40", True, "", "r-1"),
             cm.CkptInfo("step_30", 30, "/ck/step_30", False, "rng.pt missing", None)]
    raw = (FIXTURES / "checkpoints" / "list-entries.json").read_text()
    assert json.dumps([c.to_json() for c in infos]) + "\n" == raw
    assert [cm.CkptInfo.from_json(d) for d in json.loads(raw)] == infos


def test_a_listing_entry_takes_its_name_from_the_path_and_its_step_from_the_name():
    assert cm.CkptInfo.from_json({"path": "/c/step_9/", "valid": True}) == \
        cm.CkptInfo("step_9", 9, "/c/step_9/", True)
    assert cm.CkptInfo.from_json({"name": "step_3", "step": "3", "run": ""}) == \
        cm.CkptInfo("step_3", 3, "", False)
    assert cm.CkptInfo.from_json({"name": "step_3", "step": -1}).step == -1
    assert cm.CkptInfo.from_json({"path": "/c/other"}) == cm.CkptInfo("other", -1, "/c/other", False)
    with pytest.raises(ContractError, match="a checkpoint listing entry is not a JSON object"):
        cm.CkptInfo.from_json([1])  # type: ignore[arg-type]


# --- the notice of a read-only run directory ------------------------------------------------

NOTICE = runfiles.Notice(run_id="r-1", run_dir="/runs/r-1", pid=777, status="failed",
                         reason="its run directory went read-only", t=1700000000.5)


def test_a_notice_writes_the_samples_bytes_and_reads_back(tmp_path):
    runfiles.write_json_atomic(str(tmp_path / "n.json"), NOTICE.to_json())
    raw = (FIXTURES / "notice" / "notice.json").read_bytes()
    assert (tmp_path / "n.json").read_bytes() == raw
    assert runfiles.Notice.from_json(json.loads(raw)) == NOTICE
    run_dir = tmp_path / "runs" / "r-2"
    run_dir.mkdir(parents=True)
    mine = replace(NOTICE, run_id="r-2", run_dir=str(run_dir))
    path = runfiles.write_notice(mine)
    assert path == runfiles.notice_paths(str(run_dir))[0]
    assert runfiles.read_notice(str(run_dir), 777) == (mine, path)
    assert runfiles.read_notice(str(run_dir), 778) is None


def test_a_notice_that_is_not_one_is_refused_and_skipped(tmp_path):
    for bad, needle in (([1], "a notice is not a JSON object"),
                        ({**NOTICE.to_json(), "pid": "777"}, "a notice's 'pid' is str '777'"),
                        ({k: v for k, v in NOTICE.to_json().items() if k != "reason"},
                         "a notice lacks its 'reason' field")):
        with pytest.raises(ContractError, match=needle):
            runfiles.Notice.from_json(bad)
    run_dir = tmp_path / "r-3"
    run_dir.mkdir()
    where = runfiles.notice_paths(str(run_dir))[0]
    Path(where).write_text(json.dumps({**NOTICE.to_json(), "run_dir": str(run_dir),
                                       "t": "later"}))
    assert runfiles.read_notice(str(run_dir), 777) is None


# --- the group store's decision -------------------------------------------------------------

_CAUSE = gs.NodeOutcome(node=1, host="gpu2", cls="oom", reason="OutOfMemoryError", exit_code=1,
                        evidence=(EvidenceLine(line=3, text="CUDA out of memory", rule="oom"),),
                        cache_fault="x.so", origin=True)
_FALLBACK = events.Fallback(attempt=1, cls="oom", step="batch", changed={"train.batch": 4},
                            overrides={"train.batch": 4}, restore_cache=False,
                            t=1700000001.0, mono=55.5)
_RESTART = events.Restart(attempt=2, delay_s=0.1, reason="restart 1/5", t=1700000002.0,
                          mono=56.0)
VERDICT = gs.GroupVerdict(action="restart", cause=_CAUSE, overrides={"train.batch": 4},
                          fallback=_FALLBACK, restart=_RESTART,
                          last_checkpoint=CheckpointRef(step=4, path="/h/ck/step_4"), last_step=5)
FINAL = gs.GroupVerdict(action="final", status="failed", reason="node gpu2 lost")


def test_a_decision_writes_the_samples_bytes_and_reads_back():
    for verdict, name in ((VERDICT, "decision-restart.txt"), (FINAL, "decision-final.txt")):
        raw = (FIXTURES / "group_store" / name).read_text()
        assert verdict.to_text() + "\n" == raw
        # the events travel without the writer's own clock (mono)
        want = replace(verdict, fallback=verdict.fallback and replace(verdict.fallback, mono=None),
                       restart=verdict.restart and replace(verdict.restart, mono=None))
        assert gs.GroupVerdict.from_text(raw) == want
        assert gs.GroupVerdict.from_text(want.to_text()) == want


def test_a_decision_reads_an_empty_cause_as_none_and_an_event_without_t_at_t_0():
    d = json.loads(VERDICT.to_text())
    d["cause"] = {}
    del d["fallback"]["t"], d["restart"]["t"]
    got = gs.GroupVerdict.from_text(json.dumps(d))
    assert got.cause is None and got.fallback and got.fallback.t == 0.0
    assert got.restart and got.restart.t == 0.0 and got.restart.attempt == 2
    # tolerant, as the group store's other messages: a mistyped field takes its default
    got = gs.GroupVerdict.from_text(json.dumps({**d, "status": None, "last_step": "5"}))
    assert got.status == "" and got.last_step is None


def test_a_decision_that_is_not_one_is_refused():
    with pytest.raises(VersionError, match="a group store decision of format version 2"):
        gs.GroupVerdict.from_text('{"v": 2, "action": "final"}')
    with pytest.raises(ContractError, match="unknown group decision 'maybe'"):
        gs.GroupVerdict.from_text('{"action": "maybe"}')
    with pytest.raises(ContractError, match="a group store decision is not JSON"):
        gs.GroupVerdict.from_text("{torn")
    with pytest.raises(ContractError, match="a group store decision's 'cause' lacks its 'node'"):
        gs.GroupVerdict.from_text('{"action": "final", "cause": {"class": "oom"}}')
