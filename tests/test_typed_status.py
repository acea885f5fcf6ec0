"""A run's state and the host's status and stop replies are typed records: parsed once
(``from_json``), read by attribute everywhere after.

- the records round-trip through their JSON, keep keys they do not know, and a run's JSON is
  its state.json object with the host's keys beside it (``dfo status --json``);
- ``status-key``: an AST scan of orchestrator/ finds no module that handles query replies
  (it calls ``status``/``one``/``stop``/``query``/``current_run``/``run_info`` or imports
  ``dfo_contract.status``) indexing or ``.get``-ing a key of RunState, RunStatus, QueryReply
  or StopReply on a receiver named like such a record (``info["shown_status"]``,
  ``r.get("last_checkpoint")``, ``(o.value or {}).get("status")``, ``runs[0]["pid"]``).
"""

from __future__ import annotations

import ast
import json
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest

from dfo_contract.state_records import CheckpointRef
from dfo_contract.goodput import Goodput
from dfo_contract.runstate import Attempt, RunState
from dfo_contract.status import STATUS_KEYS, QueryReply, RunStatus, StopReply
from orchestrator.engine.run_query import StopOutcome

REPO = Path(__file__).resolve().parents[1]

#: the JSON keys of the records (their fields; a run's status writes its version as
#: ``status_version``; ``nothing_to_stop`` is ``dfo stop``'s)
KEYS = ({f.name for c in (RunState, RunStatus, QueryReply, StopReply, StopOutcome)
         for f in fields(c)} | set(STATUS_KEYS)) - {"extra", "state", "run"}
#: names a status record goes by where it is read
RECEIVERS = {"info", "r", "run", "runs", "st", "state", "reply", "res", "q", "last", "head",
             "value", "one", "status", "stop", "query", "run_info", "o", "outcome"}
#: calls that give a status record
CALLS = {"status", "one", "stop", "query", "current_run", "run_info"}


def _const(n: ast.AST) -> str | None:
    return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None


def _key_access(n: ast.AST) -> tuple[ast.AST, str] | None:
    """(receiver, key) of ``x["key"]`` or ``x.get("key", ...)``."""
    if isinstance(n, ast.Subscript) and _const(n.slice) is not None:
        return n.value, _const(n.slice)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
            n.func.attr == "get" and n.args and _const(n.args[0]) is not None:
        return n.func.value, _const(n.args[0])
    return None


def _name(n: ast.AST) -> str | None:
    """The name a receiver goes by: ``info``, ``x.value`` -> value, ``runs[0]`` -> runs,
    ``(o.value or {})`` -> value, ``run_ops.status(r)[0]`` -> status."""
    while True:
        if isinstance(n, ast.BoolOp):
            n = n.values[0]
        elif isinstance(n, ast.Subscript):
            n = n.value
        elif isinstance(n, ast.Call):
            n = n.func
        elif isinstance(n, ast.Attribute):
            return n.attr
        elif isinstance(n, ast.Name):
            return n.id
        else:
            return None


def _handles_replies(tree: ast.AST) -> bool:
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in CALLS:
                return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("dfo_contract.status"):
            return True
    return False


def violations(source: str, path: str) -> list[str]:
    tree = ast.parse(source)
    if not _handles_replies(tree):
        return []
    out = []
    for n in ast.walk(tree):
        acc = _key_access(n)
        if acc is not None and acc[1] in KEYS and _name(acc[0]) in RECEIVERS:
            out.append(f"{path}:{n.lineno}: status-key: {ast.unparse(n)}")
    return out


def scan(root: Path) -> list[str]:
    out: list[str] = []
    for p in sorted((root / "orchestrator").rglob("*.py")):
        out += violations(p.read_text(), p.relative_to(root).as_posix())
    return out


def test_orchestrator_reads_status_records_by_attribute():
    found = scan(REPO)
    assert not found, "\n".join(found)


def test_the_rule_finds_string_keyed_reads():
    src = textwrap.dedent('''
        def show(run_ops, run_id):
            info = run_ops.one(run_id)
            if info["shown_status"] == "lost":
                pass
            for r in run_ops.status(None):
                ck = r.get("last_checkpoint") or {}
            q = run_ops.query()
            return q["lock_owner"], (o.value or {}).get("status"), run_ops.status(run_id)[0]["pid"]
    ''')
    found = violations(src, "orchestrator/cli/x.py")
    assert sorted(v.split("status-key: ")[1] for v in found) == sorted([
        "info['shown_status']", "r.get('last_checkpoint')", "q['lock_owner']",
        "(o.value or {}).get('status')", "run_ops.status(run_id)[0]['pid']"]), found


def test_the_rule_leaves_other_dicts_and_attribute_reads_alone():
    src = textwrap.dedent('''
        def show(run_ops, run_id, probe, launch):
            info = run_ops.one(run_id)
            shown, ck = info.shown_status, info.state.last_checkpoint or {}
            owner = probe.get("lock_owner") or launch["status"]
            return shown, ck.get("step"), row["attempt"]
    ''')
    assert violations(src, "orchestrator/cli/x.py") == []
    # a module that handles no query reply is not scanned
    assert violations('x = info["status"]\n', "orchestrator/engine/lease.py") == []


# --- the records ------------------------------------------------------------------------------

def _state() -> RunState:
    st = RunState.new("r-20261201-000000-abcdef", "r", now=10.0)
    st.status, st.pid, st.last_step, st.attempt = "running", 42, 7, 1
    st.last_checkpoint = CheckpointRef(step=5, path="/c/step_5")
    st.attempts = [Attempt(n=1, started_at=11.0, argv=["python", "-m", "trainer"])]
    return st


def _status(**kw) -> RunStatus:
    return RunStatus(state=_state(), shown_status="running", live=True, run_dir="/r/runs/x",
                     now=20.0, recent_tokens_per_s=(1.0, 2.5),
                     time=Goodput(wall_s=10.0, train_s=7.5,
                                  lost_s={"startup": 2.0, "other": 0.5}, live=True), **kw)


def test_a_runs_json_is_its_state_with_the_hosts_keys_beside_it():
    r = _status(notice="/tmp/n.json", state_damaged="state.json is damaged (x)")
    obj = r.to_json()
    state = _state().to_json()
    for a in state["attempts"]:
        del a["argv"]        # a status carries no argv
    assert {k: obj[k] for k in state} == state
    assert set(obj) - set(state) == set(STATUS_KEYS)
    assert obj["shown_status"] == "running" and obj["time"]["goodput"] == 0.75
    assert obj["time"] == r.time.to_json() and obj["recent_tokens_per_s"] == [1.0, 2.5]
    assert list(obj)[-len(STATUS_KEYS):][:3] == ["live", "run_dir", "notice"]


@pytest.mark.parametrize("record", [
    _status(),
    _status(notice="/n", state_damaged="state.json is damaged (y)"),
    RunStatus(state=RunState(run_id="r2"), shown_status="never_started"),
])
def test_run_status_round_trips(record):
    back = RunStatus.from_json(json.loads(json.dumps(record.to_json())))
    assert back.to_json() == record.to_json()
    assert back.shown_status == record.shown_status and back.time == record.time
    assert all(a.argv is None for a in back.state.attempts)      # not carried


def test_replies_round_trip():
    q = QueryReply(runs=(_status(), RunStatus(state=RunState(run_id="r2"), shown_status="lost")),
                   lock_owner="r-20261201-000000-abcdef")
    back = QueryReply.from_json(json.loads(json.dumps(q.to_json())))
    assert back.to_json() == q.to_json() and back.lock_owner == q.lock_owner
    assert [r.run_id for r in back.runs] == ["r-20261201-000000-abcdef", "r2"]
    for s in (StopReply(stopped=True, pid=42),
              StopReply(stopped=False, why="not live (done)", status="done")):
        assert StopReply.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert StopOutcome(_status(), nothing_to_stop=True).to_json() == \
        {**_status().to_json(), "nothing_to_stop": True}
    assert "nothing_to_stop" not in StopOutcome(_status()).to_json()


def test_unknown_keys_are_kept_and_written_back():
    obj = {**_status().to_json(), "from_a_newer_host": [1, 2]}
    r = RunStatus.from_json(obj)
    assert r.state.extra == {"from_a_newer_host": [1, 2]}
    assert r.to_json()["from_a_newer_host"] == [1, 2]
    q = QueryReply.from_json({"runs": [obj], "lock_owner": None, "hint": "x", "version": 1})
    assert q.extra == {"hint": "x"} and q.to_json()["hint"] == "x"
    assert q.runs[0].state.extra == {"from_a_newer_host": [1, 2]}
    s = StopReply.from_json({"stopped": False, "why": "no such run", "signal": "TERM"})
    assert s.why == "no such run" and s.to_json()["signal"] == "TERM"


def test_a_reply_that_is_not_one_is_refused():
    for bad in ([], {"runs": {}}, {"runs": [{"status": "running"}]}, {"runs": [3]}):
        with pytest.raises(ValueError):
            QueryReply.from_json(bad)
    # a run's status is read tolerant, as its state.json: a mistyped field is its default
    r = QueryReply.from_json({"runs": [{"run_id": "r", "live": "yes",
                                        "recent_tokens_per_s": 3, "status": "running"}]}).runs[0]
    assert (r.live, r.recent_tokens_per_s, r.shown_status) == (False, (), "running")
    for bad in ({}, {"stopped": "yes"}, {"stopped": True, "pid": "42"}):
        with pytest.raises(ValueError):
            StopReply.from_json(bad)
    # a time account that cannot be read only leaves the figure out
    r = RunStatus.from_json({"run_id": "r", "time": {"goodput": "x"}})
    assert r.time is None and r.shown_status == "starting"


def test_goodput_round_trips():
    g = Goodput(wall_s=100.0, train_s=46.37, lost_s={"startup": 50.0, "other": 3.63},
                live=False)
    assert Goodput.from_json(json.loads(json.dumps(g.to_json()))) == g
