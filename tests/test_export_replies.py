"""The replies ``dfo export`` reads from the host, decoded by the one codec: the export's
last line (``python -m trainer export``), the checkpoint listing
(``python -m dfo_contract.checkpoints list --json``) and ``<checkpoints>/best``, each from
what its real producer writes."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from dfo_contract import checkpoints as cm
from dfo_contract.errors import ContractError
from dfo_contract.replies import BestCheckpoint, CheckpointListing, ExportReply


def _save(root, step: int, *, run: str = "r-1") -> None:
    d = root / f"step_{step}"
    d.mkdir(parents=True)
    for name in cm.REQUIRED_FILES:
        (d / name).write_bytes(name.encode() * step)
    cm.write_manifest(str(d), step, list(cm.REQUIRED_FILES), lineage={"run": run, "attempt": 1})


def test_the_checkpoint_listing_reads_what_the_lister_prints(tmp_path):
    for step in (20, 10, 40):
        _save(tmp_path / "ck", step)
    (tmp_path / "ck" / "step_40" / "drafter.safetensors").write_bytes(b"torn")
    out = io.StringIO()
    with redirect_stdout(out):
        assert cm.main(["list", str(tmp_path / "ck"), "--json", "--run", "r-1"]) == 0
    got = CheckpointListing.from_json(json.loads(out.getvalue()))
    assert got.dir == str(tmp_path / "ck") and got.latest == "step_20"
    assert [(c.step, c.valid, c.run) for c in got.oldest_first()] == [
        (10, True, "r-1"), (20, True, "r-1"), (40, False, "r-1")]
    assert "truncated" in got.oldest_first()[-1].reason and got.runs_in_dir == ["r-1"]
    with pytest.raises(ContractError, match="the checkpoint listing's 'checkpoints'"):
        CheckpointListing.from_json({"dir": "/x", "checkpoints": {"step_1": {}}})


def test_the_export_reply_and_the_best_record():
    line = {"kind": "export", "out": "/root/dfo/exports/t/step_8", "step": 8, "accept_len": 2.5,
            "target_precision": "fp8",
            "files": {"model.safetensors": {"sha256": "ab" * 32, "size": 12}}}
    r = ExportReply.from_json(line)
    assert (r.step, r.accept_len, r.target_precision) == (8, 2.5, "fp8")
    assert r.files["model.safetensors"].size == 12
    no_precision = {k: v for k, v in line.items() if k != "target_precision"}
    assert ExportReply.from_json(no_precision).target_precision == "full"
    with pytest.raises(ContractError, match="the export's reply lacks its 'step' field"):
        ExportReply.from_json({k: v for k, v in line.items() if k != "step"})
    with pytest.raises(ContractError, match=r"the export's reply's 'files\[m\]\.size' is str"):
        ExportReply.from_json({**line, "files": {"m": {"sha256": "x", "size": "12"}}})


def test_the_best_record_reads_what_the_trainer_writes(tmp_path):
    from trainer.evaluate.accept import write_best

    path = write_best(str(tmp_path), 12, 3.25)
    with open(path) as f:
        best = BestCheckpoint.from_json(json.load(f))
    assert (best.step, best.name, best.accept_len) == (12, "step_12", 3.25)
    with pytest.raises(ContractError, match="lacks its 'step' field"):
        BestCheckpoint.from_json({"name": "step_12"})
