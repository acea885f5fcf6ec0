"""The measured acceptance length reaches ``dfo status`` (state.json -> the table) and the
best checkpoint by it survives ``checkpoint.keep`` pruning. Real files, no mocks."""

from __future__ import annotations

import json

from orchestrator.cli.status import row_values, status_table
from dfo_contract.goodput import Goodput
from dfo_contract.runstate import RunState
from dfo_contract.status import RunStatus


def _run(**kw) -> RunStatus:
    st = RunState.new("demo-20261201-000000-abcdef", "demo", now=0.0)
    st.status, st.last_step, st.tokens_per_s = "running", 120, 900.0
    for k, v in kw.items():
        setattr(st, k, v)
    return _with(st.to_json())


def _with(obj: dict, **keys) -> RunStatus:
    """The run as the host's query replies it: state.json's keys and ``keys`` beside them."""
    return RunStatus.from_json(json.loads(json.dumps({**obj, **keys})))


def test_accept_cell_shows_the_latest_and_the_best():
    assert row_values(_run())["accept"].plain == "-"
    assert row_values(_run(accept_len=3.912, best_accept_len=3.912))["accept"].plain == "3.91"
    cell = row_values(_run(accept_len=3.5, best_accept_len=4.13))["accept"].plain
    assert cell == "3.50 (best 4.13)"
    assert row_values(_run(accept_len="nan?"))["accept"].plain == "-"   # hand-edited state


def test_accept_column_in_the_wide_table():
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(status_table("local", [_run(accept_len=2.95, best_accept_len=2.95)], wide=True))
    text = con.export_text()
    assert "accept" in text and "2.95" in text


def test_prune_keeps_the_best_checkpoint(tmp_path):
    import torch  # noqa: F401  (trainer.core.checkpoints needs torch)

    from dfo_contract import checkpoints as cm
    from trainer.core import checkpoints
    from trainer.evaluate.accept import write_best

    ck = tmp_path / "ck"
    for n in (10, 20, 30, 40):
        d = ck / f"step_{n}"
        d.mkdir(parents=True)
        for name in cm.REQUIRED_FILES:
            (d / name).write_text(f"{name} {n}\n")
        cm.write_manifest(str(d), n, list(cm.REQUIRED_FILES), lineage={"run": "r1", "attempt": 1})
    write_best(str(ck), 20, 4.1)
    removed = checkpoints.prune(str(ck), 2, run_id="r1")
    assert sorted(p.rsplit("/", 1)[1] for p in removed) == ["step_10"]   # not step_20
    assert (ck / "step_20").is_dir() and (ck / "step_30").is_dir() and (ck / "step_40").is_dir()


def test_goodput_cell_is_the_share_of_time_spent_training():
    assert row_values(_run())["goodput"].plain == "-"
    # the query adds the run's time account beside its state (supervisor/query.py)
    share = Goodput(wall_s=100.0, train_s=46.37, lost_s={}, live=True).to_json()
    assert share["goodput"] == 0.4637
    assert row_values(_with(_run().to_json(), time=share))["goodput"].plain == "46%"
    assert row_values(_with(_run().to_json(), time={"goodput": "x"}))["goodput"].plain == "-"   # hand-edited
    assert row_values(_with(_run().to_json(), time=None))["goodput"].plain == "-"


def test_a_terminal_leaves_out_an_optional_column_without_a_value():
    from orchestrator.cli.status import COLUMNS, columns_for

    rows = [{c: v.plain for c, v in row_values(_run()).items()}]
    assert rows[0]["accept"] == rows[0]["goodput"] == "-"
    cols = columns_for(200, cells=rows)
    assert "accept" not in cols and "goodput" not in cols and "trend" not in cols
    assert cols[:3] == ["run", "state", "step"] and "checkpoint" not in cols
    half = Goodput(wall_s=10.0, train_s=5.0, lost_s={}, live=True).to_json()
    rows = [{c: v.plain for c, v in row_values(_with(_run(accept_len=3.1).to_json(),
                                                     time=half)).items()}]
    cols = columns_for(200, cells=rows)
    assert "accept" in cols and "goodput" in cols
    assert columns_for(60, wide=True, cells=rows) == list(COLUMNS)   # --wide: every column
