"""The supervisor with the real trainer on CPU (tiny config) through the local transport.

Faults are injected with the trainer's own facility (DFO_FAULT); the envs/current of the
host root is this venv (see tests/supervisor_env.py). Small thresholds and backoffs.
"""

from __future__ import annotations

import json

import pytest

from tests.supervisor_env import events, kinds, launch, local_run_ops, wait_final, write_config

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path, tiny_assets):  # noqa: F811
    return local_run_ops(tmp_path)


def test_fx_error_is_classified_falls_back_and_resumes(setup, tiny_assets):  # noqa: F811
    # the tiny config does not compile: the ladder's compile_gate could not change the run,
    # so its first step that does is layout_ddp
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="fx_race@6")
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    cl = kinds(evs, "classified")
    assert cl[0].cls == "fx_trace_race" and cl[0].attempt == 1
    assert any("Detected that you are using FX" in t for t in cl[0].evidence_texts())
    fb = kinds(evs, "fallback")[0]
    assert fb.step == "layout_ddp" and fb.changed == {"parallel.layout": "ddp"}
    assert not fb.restore_cache
    starts = kinds(evs, "attempt_start")
    assert len(starts) == 2 and starts[1].resume.endswith("/step_4")
    argv = starts[1].argv
    assert "--parallel.layout=ddp" in argv and "torch.distributed.run" in argv
    assert not any("compile.gate" in a for a in argv)
    assert cl[-1].cls == "done" and info["last_step"] == 12
    assert info["overrides"] == {"parallel.layout": "ddp"}
    order = [e.kind for e in evs]
    assert order.index("classified") < order.index("fallback") < order.index("restart") \
        < len(order) - 1 - order[::-1].index("attempt_start")
    # the second attempt went on from the first one's last checkpoint (step 4)
    log2 = (root / "runs" / plan.run_id / "attempt-2.log").read_text().splitlines()
    steps = [json.loads(ln[5:])["step"] for ln in log2
             if ln.startswith("@dfo ") and '"kind": "step"' in ln]
    assert steps[0] == 5 and steps[-1] == 12


def test_hang_is_detected_stacks_saved_and_restarted(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="hang@5", thresholds={"train_s": 6})
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    wd = [e for e in kinds(evs, "watchdog") if "without progress" in e.reason]
    assert wd and "threshold 6s" in wd[0].reason
    st = kinds(evs, "stacks")[0].files
    text = (root / "runs" / plan.run_id / st[0]).read_text()
    assert "Current thread" in text or "Thread 0x" in text      # faulthandler's dump
    assert "trainer" in text and "wchan=" in text
    assert kinds(evs, "classified")[0].cls == "compile_hang"
    # acted on train_s (6 s) after attempt 1's last marker, not after a default (300 s),
    # however long the attempts took to start on a busy box
    log1 = (root / "runs" / plan.run_id / "attempt-1.log").read_text().splitlines()
    last = max(json.loads(ln[5:])["t"] for ln in log1 if ln.startswith("@dfo "))
    assert 6 <= wd[0].t - last < 120, wd[0].t - last


def test_eval_markers_reach_the_state_and_events(setup, tiny_assets):  # noqa: F811
    """The trainer's held-out evaluation (measured acceptance length) under the real
    supervisor: state.json and events carry it (a supervisor that did not know the ``eval``
    event kind crashed on the first one: seen in the demo)."""
    import yaml

    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    c = yaml.safe_load(cfg.read_text())
    c["data"]["eval_path"] = str(tiny_assets / "synth.jsonl")
    c.setdefault("eval", {}).update({"every": 4, "max_samples": 4})
    cfg.write_text(yaml.safe_dump(c))
    plan = launch(run_ops, cfg)
    info = wait_final(run_ops, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    assert len(info["attempts"]) == 1
    evals = kinds(events(root, plan.run_id), "eval")
    assert [e.step for e in evals] == [4, 8, 12]
    assert info["accept_len"] == evals[-1].accept_len and info["accept_len"] >= 1.0
    assert info["best_accept_len"] == max(e.accept_len for e in evals)


def test_oom_halves_micro_batch(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="oom@3")
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    assert kinds(evs, "classified")[0].cls == "oom"
    fb = kinds(evs, "fallback")[0]
    assert fb.step == "halve_micro_batch" and fb.changed == {"train.micro_batch": 4}
    argv = kinds(evs, "attempt_start")[1].argv
    assert "--train.micro_batch=4" in argv
    assert kinds(evs, "attempt_start")[1].resume is None   # no checkpoint before step 3


def test_dense_warning_is_acted_on_live_with_a_checkpoint(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 14})
    plan = launch(run_ops, cfg, fault="slow=0.5@6")
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    wd = kinds(evs, "watchdog")
    assert any("dense_fallback seen in the output (flex-dense-warning)" in e.reason for e in wd)
    end1 = kinds(evs, "attempt_end")[0]
    assert end1.exit_code == 6, "SIGTERM: the slow trainer checkpointed and exited 6"
    cl = kinds(evs, "classified")[0]
    assert cl.cls == "dense_fallback"
    assert any("materializes the full scores matrix" in t for t in cl.evidence_texts())
    resume = kinds(evs, "attempt_start")[1].resume
    # the checkpoint written on SIGTERM: at or after the slowdown (how far past depends on
    # the machine's load), and before the run's end
    step = int(resume.rsplit("step_", 1)[1])
    assert 5 <= step < 14, resume


def test_nan_loss_restarts_from_the_checkpoint(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="nan@6")
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    assert kinds(evs, "classified")[0].cls == "nan_loss"
    fb = kinds(evs, "fallback")[0]
    assert fb.step == "same" and fb.changed == {}
    assert kinds(evs, "attempt_start")[1].resume.endswith("/step_4")


def test_permanent_error_fails_at_once(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="exit=3@1#*")
    info = wait_final(run_ops, plan.run_id)
    assert info["status"] == "failed" and info["attempt"] == 1
    assert "data error (exit 3)" in info["reason"] and "restarting cannot help" in info["reason"]


def test_a_config_edited_mid_run_is_named_and_not_taken(setup, tiny_assets):  # noqa: F811
    """An edit of the live run's config.yaml never reaches a later attempt: the restart
    trains with the launch config and says what was changed."""
    import time

    import yaml

    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, fault="hang@5", thresholds={"train_s": 20})
    run = root / "runs" / plan.run_id
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:   # attempt 1 is hung at step 5 once step 4 is logged
        log1 = run / "attempt-1.log"
        if log1.exists() and '"step": 4' in log1.read_text():
            break
        time.sleep(0.2)
    launched = (run / "config.launched.yaml").read_text()
    conf = yaml.safe_load((run / "config.yaml").read_text())
    old_lr = conf["train"]["lr"]
    conf["train"]["lr"] = old_lr * 5
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    edited = kinds(evs, "config_edited")
    assert [e.attempt for e in edited] == [2]
    assert edited[0].changed == {"train.lr": [old_lr, old_lr * 5]}
    assert "this run keeps the config it was launched with" in edited[0].describe()
    starts = kinds(evs, "attempt_start")
    assert all(str(run / "config.launched.yaml") in s.argv for s in starts)
    assert (run / "config.launched.yaml").read_text() == launched
    log2 = (run / "attempt-2.log").read_text().splitlines()
    lrs = [json.loads(ln[5:])["lr"] for ln in log2 if ln.startswith("@dfo ") and '"kind": "step"' in ln]
    log1 = (run / "attempt-1.log").read_text().splitlines()
    lr1 = [json.loads(ln[5:])["lr"] for ln in log1 if ln.startswith("@dfo ") and '"kind": "step"' in ln]
    assert lrs and max(lrs) <= max(lr1) * 1.01     # not five times the launch lr
