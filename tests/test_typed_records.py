"""Records that cross a process are typed: the group store's messages
(``dfo_contract.group_store``) and metrics.jsonl's records (``dfo_contract.metrics_record``)
are read through their dataclasses, and each class name in orchestrator/, dfo_contract/
and trainer/ names one class.

An AST scan of orchestrator/ and trainer/ (each rule below has a self-test on such code):

- ``group-store``: a module that handles group store messages (it imports
  ``group_store``, the coordinator or ``supervisor.policy.group_decide``) looks up no message field
  (a key of a message's JSON) by a constant string: ``x["reason"]``, ``x.get("pids")``;
- ``metrics``: a module that handles metrics.jsonl (it names the file or imports
  ``metrics_record``) looks up no record field by a constant string on a record
  (a name such as ``rec``, ``r``, ``record``, ``row``, ``m``);
- ``twin-class``: no two classes share a name.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

from dfo_contract import events
from dfo_contract.state_records import CheckpointRef
from dfo_contract import group_store as gs
from dfo_contract.metrics_record import MetricsRecord

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("orchestrator", "trainer")
CLASS_TREES = ("orchestrator", "dfo_contract", "trainer")

_OUTCOME = gs.NodeOutcome(node=1, host="h", cls="oom", reason="r", exit_code=1,
                          cache_fault="x")
#: one instance of each message, every optional field set (a node's end: _OUTCOME)
_MESSAGES = (
    gs.AttemptPlan(overrides={"a": 1}, resume="/c/step_1", rdzv_id="r-a1"),
    gs.AttemptAbort(node=1, host="h", reason="r"),
    gs.StoppedPids((7,)),
    gs.GroupVerdict(action="restart", cause=_OUTCOME, status="s", reason="r",
                    overrides={"a": 1},
                    fallback=events.Fallback(attempt=1, cls="oom", step="s", changed={},
                                             overrides={}, restore_cache=False),
                    restart=events.Restart(attempt=2, delay_s=0.1, reason="r"),
                    last_checkpoint=CheckpointRef(step=1, path="/c/step_1"),
                    last_step=1),
    gs.StopRequest(node=1, host="h", reason="r"),
)
#: the keys of the group store messages' JSON
STORE_KEYS = {k for text in (gs.end_text(_OUTCOME), *(m.to_text() for m in _MESSAGES))
              for k in json.loads(text)}
#: the keys of metrics.jsonl records' JSON (a training step's and an evaluation's)
METRICS_KEYS = set(MetricsRecord(step=1, acc_per_pos=(0.5,), accept_len=1.0).to_json()) | \
    set(MetricsRecord(step=1, phase="eval", loss=1.0).to_json())
#: names a metrics.jsonl record goes by
RECORD_NAMES = {"rec", "recs", "r", "record", "records", "row", "m", "metric", "line", "obj"}

#: class names defined more than once, each with why both stay (none)
TWIN_CLASSES: dict[str, str] = {}


def _const(n: ast.AST) -> str | None:
    return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None


def _lookup(n: ast.AST) -> tuple[ast.AST, str] | None:
    """(receiver, key) of a read ``x["key"]`` or ``x.get("key", ...)``."""
    if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and \
            _const(n.slice) is not None:
        return n.value, _const(n.slice)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
            n.func.attr == "get" and n.args and _const(n.args[0]) is not None:
        return n.func.value, _const(n.args[0])
    return None


def _base_name(n: ast.AST) -> str | None:
    """``rec`` of ``rec``, ``recs[-1]``."""
    while isinstance(n, ast.Subscript):
        n = n.value
    return n.id if isinstance(n, ast.Name) else None


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            out.add(n.module or "")
            out.update(f"{n.module or ''}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def handles_store(tree: ast.AST) -> bool:
    return any(m.endswith(("group_store", "coordinator", "group_decide"))
               for m in _imports(tree))


def handles_metrics(tree: ast.AST) -> bool:
    return any(m.endswith("metrics_record") for m in _imports(tree)) or any(
        _const(n) is not None and "metrics.jsonl" in _const(n) for n in ast.walk(tree))


def violations(source: str, path: str) -> list[str]:
    tree = ast.parse(source)
    out: list[str] = []
    store, metrics = handles_store(tree), handles_metrics(tree)
    for n in ast.walk(tree):
        acc = _lookup(n)
        if acc is None:
            continue
        recv, key = acc
        if store and key in STORE_KEYS:
            out.append(f"{path}:{n.lineno}: group-store: [{key!r}]")
        elif metrics and key in METRICS_KEYS and _base_name(recv) in RECORD_NAMES:
            out.append(f"{path}:{n.lineno}: metrics: {_base_name(recv)}[{key!r}]")
    return out


def scan(root: Path) -> list[str]:
    out: list[str] = []
    for top in SCANNED:
        for p in sorted((root / top).rglob("*.py")):
            out += violations(p.read_text(), p.relative_to(root).as_posix())
    return sorted(set(out))


def class_names(root: Path) -> dict[str, list[str]]:
    """Each class name -> where it is defined (``path:line``)."""
    out: dict[str, list[str]] = {}
    for top in CLASS_TREES:
        for p in sorted((root / top).rglob("*.py")):
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, ast.ClassDef):
                    out.setdefault(n.name, []).append(
                        f"{p.relative_to(root).as_posix()}:{n.lineno}")
    return out


def twins(root: Path) -> dict[str, list[str]]:
    return {k: v for k, v in class_names(root).items() if len(v) > 1}


# --- the repository -----------------------------------------------------------------------

def test_no_string_keyed_lookup_of_a_store_message_or_a_metrics_record():
    found = scan(REPO)
    assert not found, "\n".join(found)


def test_no_two_classes_share_a_name():
    found = {k: v for k, v in twins(REPO).items() if k not in TWIN_CLASSES}
    assert not found, "\n".join(f"{k}: {', '.join(v)}" for k, v in sorted(found.items()))


def test_each_listed_twin_is_still_one():
    gone = set(TWIN_CLASSES) - set(twins(REPO))
    assert not gone, f"no longer twins, drop them from TWIN_CLASSES: {sorted(gone)}"


def test_the_key_sets_come_from_the_dataclasses():
    assert {"pids", "rdzv_id", "class", "cache_fault", "action", "last_step"} <= STORE_KEYS
    assert {"step", "loss", "tokens_per_s", "accept_len", "phase", "attempt", "v"} <= METRICS_KEYS


# --- the rules find what they are for -------------------------------------------------------

def _src(code: str) -> str:
    return textwrap.dedent(code)


def test_a_hand_read_store_message_is_found():
    code = _src('''
        from dfo_contract import group_store as gk

        def peer_abort(c, n, me):
            r = c.aborted_raw(n)
            if r and int(r.get("node", -1)) != me:
                return f"node {r['host']}: {r.get('reason')}"
            return json.loads(c.raw(gk.key_stopped(n, 1)))["pids"]
    ''')
    got = violations(code, "orchestrator/supervisor/x.py")
    assert sorted(g.split(": ", 2)[2] for g in got) == ["['host']", "['node']", "['pids']",
                                                        "['reason']"]
    # a module that handles no store message is not scanned for them
    assert violations(code.replace("from dfo_contract import group_store as gk", ""),
                      "orchestrator/plan/x.py") == []


def test_a_hand_read_metrics_record_is_found():
    code = _src('''
        def tail(path):
            recs = read_jsonl(path + "/metrics.jsonl").records
            for rec in recs:
                yield rec.get("step"), rec["tokens_per_s"], recs[-1]["loss"]
            ck = state.get("last_checkpoint") or {}
            return ck.get("step")          # state.json's checkpoint, not a record
    ''')
    got = violations(code, "orchestrator/supervisor/x.py")
    assert sorted(g.split(": ", 2)[2] for g in got) == ["rec['step']", "rec['tokens_per_s']",
                                                        "recs['loss']"]
    assert violations(code.replace("metrics.jsonl", "other.jsonl"), "orchestrator/x.py") == []


def test_typed_reads_pass():
    code = _src('''
        from dfo_contract.group_store import AttemptAbort
        from dfo_contract.metrics_record import parse_metrics

        def f(c, n, text, d):
            r = c.aborted(n)
            recs = parse_metrics(text)
            d["x"] = 1
            return r.node, r.host, recs[-1].step, recs[-1].tokens_per_s
    ''')
    assert violations(code, "orchestrator/supervisor/x.py") == []


def test_twin_classes_are_found(tmp_path):
    for rel, code in (("orchestrator/plan/a.py", "class Checkpoint:\n    pass\n"),
                      ("dfo_contract/b.py", "class Checkpoint(Base):\n    pass\n"),
                      ("trainer/c.py", "class Other:\n    pass\n")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(code)
    assert twins(tmp_path) == {"Checkpoint": ["orchestrator/plan/a.py:1", "dfo_contract/b.py:1"]}
