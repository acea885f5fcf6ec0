"""Measured acceptance length: SpecForge's per-block definition, the eval hook, the best pointer;
and the anchor rule (up to the second-to-last loss token, the tail block padded and masked)."""

from __future__ import annotations

import io
import json

import torch

from tests.helpers.trainer import make_synth, make_target, markers, tiny_config
from trainer.model import blocks
from trainer.core import objective
from trainer.evaluate.accept import block_accept_lengths, read_best

B = 8


def _loop_reference(pred, labels, counted):
    """1 + the leading run of slots 1..B-1 that are correct or unlabelled, counting labelled ones."""
    out = torch.zeros(pred.shape[:2])
    for i in range(pred.shape[0]):
        for n in range(pred.shape[1]):
            acc = 0
            for k in range(1, pred.shape[2]):
                if counted[i, n, k] and pred[i, n, k] != labels[i, n, k]:
                    break
                acc += int(counted[i, n, k])
            out[i, n] = 1 + acc
    return out


def test_block_accept_lengths_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (6, 5, B), generator=g)
    pred = torch.where(torch.rand(6, 5, B, generator=g) < 0.7, labels, (labels + 1) % 4)
    counted = torch.rand(6, 5, B, generator=g) < 0.85
    torch.testing.assert_close(block_accept_lengths(pred, labels, counted),
                               _loop_reference(pred, labels, counted))


def test_oracle_and_shifted_drafts():
    labels = torch.arange(2 * 3 * B).view(2, 3, B)
    counted = torch.ones_like(labels, dtype=torch.bool)
    assert (block_accept_lengths(labels, labels, counted) == B).all()        # oracle: B
    shifted = torch.roll(labels, 1, dims=-1)
    assert (block_accept_lengths(shifted, labels, counted) == 1).all()       # off by one: 1
    first_wrong = labels.clone()
    first_wrong[..., 4] += 1
    assert (block_accept_lengths(first_wrong, labels, counted) == 4).all()   # slots 1-3 + bonus


def test_tail_anchors_follow_specforge():
    """Anchors up to len-2 (second-to-last loss token); past the row, labels do not count."""
    s = 16
    lm = torch.ones(1, s, dtype=torch.bool)
    lens = torch.tensor([s])
    elig = blocks.eligible_anchors(lm, lens, B)
    assert elig[0].nonzero().flatten().tolist() == list(range(s - 1))
    ids = torch.arange(100, 100 + s).unsqueeze(0)
    anchors = torch.tensor([[s - 2, s - 5]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    labels, w, counted = objective.labels_and_weights(ids, lm, anchors, valid, B, 4.0)
    assert counted[0, 0].tolist() == [False, True] + [False] * (B - 2)
    assert counted[0, 1].tolist() == [False] + [True] * 4 + [False] * (B - 5)
    assert (w[~counted] == 0).all()
    assert labels[0, 0, 1] == 100 + s - 1


def test_eval_hook_metrics_markers_and_best(tmp_path):
    from trainer.train.loop import train

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "synth.jsonl"), num=24)
    held = make_synth(str(tmp_path / "held.jsonl"), num=8, seed=5)
    out = io.StringIO()
    cfg = tiny_config(target, data, str(tmp_path / "run"), **{
        "train.max_steps": 6, "data.eval_path": held, "eval.every": 3, "train.lr": 1e-2})
    assert train(cfg, out=out) == 0
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6]
    assert all(1.0 <= r["accept_len"] <= B and r["eval_blocks"] > 0 for r in evals)
    ms = markers(out.getvalue())
    assert [m["step"] for m in ms if m["kind"] == "eval"] == [3, 6]
    best = read_best(str(tmp_path / "run" / "checkpoints"))
    assert best["accept_len"] == max(r["accept_len"] for r in evals)
    data_json = json.loads((tmp_path / "run" / "checkpoints" / best["name"] / "data.json").read_text())
    assert data_json["accept_len"] == best["accept_len"]


def test_eval_without_eval_path_is_a_config_error(tmp_path):
    import pytest

    from dfo_contract.exitcodes import TrainerConfigError
    from trainer.train.loop import train

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "synth.jsonl"), num=8)
    cfg = tiny_config(target, data, str(tmp_path / "run"), **{"eval.every": 3})
    with pytest.raises(TrainerConfigError, match="--eval.every: needs --data.eval_path"):
        train(cfg, out=io.StringIO())
