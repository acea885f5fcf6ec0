"""An edit of a live run's config.yaml is told once (``config_edited`` before the next
attempt), not again before every later attempt while it stays the same; a further edit is
told again. Real files in a run directory, the supervisor's own source of attempts."""

from __future__ import annotations

import yaml

from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec
from orchestrator.supervisor.source import BundledSource


def test_an_edit_is_told_once_and_a_new_one_again(tmp_path):
    root = str(tmp_path)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"train": {"lr": 0.001, "max_steps": 10}}))
    spec = RunSpec(identity=Identity(run_id="r", run_name="r", host="local", root=root,
                                     python="python", lock=f"{root}/run.lock"),
                   config=Config(path=str(cfg)), resume=Resume(checkpoint_dir=root, path=None))
    told: list = []
    src = BundledSource(spec, Bundled(), root, emit=told.append)
    kept = src.launched_config(1)                  # attempt 1 keeps the config as launched
    assert kept.endswith("config.launched.yaml") and told == []
    cfg.write_text(yaml.safe_dump({"train": {"lr": 0.005, "max_steps": 10}}))
    for n in (2, 3, 4):
        assert src.launched_config(n) == kept
    assert [(e.attempt, e.changed) for e in told] == [(2, {"train.lr": [0.001, 0.005]})]
    cfg.write_text(yaml.safe_dump({"train": {"lr": 0.005, "max_steps": 20}}))
    src.launched_config(5)
    assert [e.attempt for e in told] == [2, 5] and "train.max_steps" in told[1].changed
