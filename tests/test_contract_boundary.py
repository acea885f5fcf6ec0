"""Only dfo_contract builds or takes apart ``spec.json``, ``events.jsonl`` records, the
trainer's ``@dfo`` markers and follow wire records.

An AST scan of orchestrator/ and trainer/ for code that does it by hand (each rule below
has a self-test on such code):

- ``emit``: the supervisor emits typed events: ``emit(SomeEvent(...))``, one argument,
  never ``emit("kind", **fields)``;
- ``kind-call``: no call names an event kind as a string with fields beside it
  (``event("final", status=...)``), no ``("kind", {fields})`` pair;
- ``kind-dict``: no dict literal carries ``"kind": "<event kind>"``;
- ``kind-test``: no ``x.get("kind")`` / ``x["kind"]`` (or a name bound to one) is compared
  with an event or trainer-marker kind (markers are typed too: ``trainer_markers``);
- ``events-json``: no function that names the events file parses JSON itself;
- ``wire``: the follower and its reader touch no wire key (``"f"``, ``"o"``, ``"l"``,
  ``"end"``, ``"eof"``, ``"k"``, ``"error"``) in a dict literal, subscript, ``.get`` or ``in``;
- ``runstate-events``: nothing imports or calls event helpers on runstate (events live in
  ``dfo_contract.events``);
- ``spec-index``: nothing named ``spec`` (or ``x.spec``) is indexed with a key of the
  untyped spec.json dict (``spec["python"]``, ``spec.get("byo")``): spec.json is read only
  into ``RunSpec``;
- ``spec-json``: a function that names spec.json reads it only into
  ``RunSpec.from_json`` and writes no dict literal to it (``RunSpec.to_json`` does).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from dfo_contract.events import REGISTRY
from dfo_contract.trainer_markers import KINDS as MARKER_TYPES
from dfo_contract import runstate

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("orchestrator", "trainer")

#: kinds of the trainer's ``@dfo`` markers (dfo_contract.trainer_markers), typed as events are
MARKER_KINDS = set(MARKER_TYPES)
EVENT_ONLY = set(REGISTRY) - MARKER_KINDS       # names no other call or dict uses
RECORD_KINDS = set(REGISTRY) | MARKER_KINDS
WIRE_KEYS = {"f", "o", "l", "end", "eof", "k", "error"}
RUNSTATE_EVENT_API = {"event", "event_line", "describe_event", "read_events", "EVENT_KINDS", "clean",
           "dumps"}
FOLLOWER = "orchestrator.supervisor.follow"
#: keys of an untyped spec.json dict (spec.json is read only into RunSpec)
SPEC_KEYS = {"run_id", "run_name", "python", "resume", "byo", "group", "coord", "thresholds",
             "checkpoint_dir", "config_path", "base_config", "overrides", "fault", "ladders",
             "budget", "lock", "restore_cache_argv", "root", "env", "host", "version"}


def _const(n: ast.AST) -> str | None:
    return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None


def _consts(n: ast.AST) -> set[str]:
    if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
        return {c for e in n.elts if (c := _const(e)) is not None}
    c = _const(n)
    return {c} if c is not None else set()


def _key_access(n: ast.AST) -> tuple[ast.AST, str] | None:
    """(receiver, key) of ``x["key"]`` or ``x.get("key", ...)``."""
    if isinstance(n, ast.Subscript) and _const(n.slice) is not None:
        return n.value, _const(n.slice)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
            n.func.attr == "get" and n.args and _const(n.args[0]) is not None:
        return n.func.value, _const(n.args[0])
    return None


def _is_spec(n: ast.AST) -> bool:
    """``spec``, ``run_spec``, ``self.spec``, ``sup.spec`` ..."""
    return (isinstance(n, ast.Name) and n.id.endswith("spec")) or \
        (isinstance(n, ast.Attribute) and n.attr.endswith("spec"))


def _names_spec_file(body: list[ast.AST]) -> bool:
    return any((isinstance(a, ast.Attribute) and a.attr == "SPEC_FILE")
               or (isinstance(a, ast.Name) and a.id == "SPEC_FILE")
               or (isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and a.value.endswith("spec.json") and " " not in a.value)
               for a in body)


def _is_kind_access(n: ast.AST, kind_names: set[str]) -> bool:
    acc = _key_access(n)
    return (acc is not None and acc[1] == "kind") or \
        (isinstance(n, ast.Name) and n.id in kind_names)


def _pairs(a: ast.Assign):
    """(name, value) of ``x = v`` and ``x, y = v, w``."""
    for t in a.targets:
        if isinstance(t, ast.Name):
            yield t, a.value
        elif isinstance(t, ast.Tuple) and isinstance(a.value, ast.Tuple):
            yield from ((x, v) for x, v in zip(t.elts, a.value.elts, strict=False) if isinstance(x, ast.Name))


def _functions(tree: ast.AST):
    yield tree
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield n


def _runstate_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to the runstate module, and names imported from it."""
    mods, names = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            for a in n.names:
                if a.name == "runstate" and mod.endswith(("ops", "dfo_contract")):
                    mods.add(a.asname or a.name)
                elif mod.endswith("runstate"):
                    names.add(a.name)
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.endswith(("ops.runstate", "dfo_contract.runstate")):
                    mods.add(a.asname or a.name)
    return mods, names


def violations(source: str, path: str) -> list[str]:
    tree = ast.parse(source)
    out: list[str] = []

    def flag(rule: str, n: ast.AST, what: str) -> None:
        out.append(f"{path}:{getattr(n, 'lineno', 0)}: {rule}: {what}")

    in_supervisor = "/supervisor/" in f"/{path}"
    wire_side = path.endswith("supervisor/follow.py") or FOLLOWER in source
    rs_mods, rs_names = _runstate_aliases(tree)
    for name in sorted(rs_names & RUNSTATE_EVENT_API):
        flag("runstate-events", tree, f"imports runstate.{name}")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and \
                n.value.id in rs_mods and n.attr in RUNSTATE_EVENT_API:
            flag("runstate-events", n, f"{n.value.id}.{n.attr}")
        if isinstance(n, ast.Call):
            f = n.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if in_supervisor and fname == "emit" and (
                    len(n.args) != 1 or n.keywords or isinstance(n.args[0], ast.Starred)
                    or _const(n.args[0]) is not None):
                flag("emit", n, "emit() takes one typed event")
            if n.args and _const(n.args[0]) in EVENT_ONLY and n.keywords:
                flag("kind-call", n, f"{fname}({_const(n.args[0])!r}, ...)")
        if isinstance(n, ast.Tuple) and len(n.elts) == 2 and \
                _const(n.elts[0]) in EVENT_ONLY and isinstance(n.elts[1], ast.Dict):
            flag("kind-call", n, f"({_const(n.elts[0])!r}, {{...}})")
        if isinstance(n, ast.Dict):
            keys = [_const(k) if k is not None else None for k in n.keys]
            for k, v in zip(keys, n.values, strict=True):
                if k == "kind" and _const(v) in EVENT_ONLY:
                    flag("kind-dict", n, f'{{"kind": {_const(v)!r}, ...}}')
            if wire_side and set(keys) & WIRE_KEYS:
                flag("wire", n, f"dict literal with {sorted(set(keys) & WIRE_KEYS)}")
        acc = _key_access(n)
        if acc is not None and acc[1] in SPEC_KEYS and _is_spec(acc[0]):
            flag("spec-index", n, f"spec[{acc[1]!r}]")
        if wire_side:
            if acc is not None and acc[1] in WIRE_KEYS:
                flag("wire", n, f"[{acc[1]!r}]")
            if isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                  for o in n.ops) and \
                    _const(n.left) in WIRE_KEYS:
                flag("wire", n, f"{_const(n.left)!r} in ...")
    for fn in _functions(tree):
        body = list(ast.walk(fn))
        kind_names = {t.id for a in body if isinstance(a, ast.Assign)
                      for t, v in _pairs(a) if _is_kind_access(v, set())}
        for c in body:
            if isinstance(c, ast.Compare):
                sides = [c.left, *c.comparators]
                if any(_is_kind_access(s, kind_names) for s in sides) and \
                        any(_consts(s) & RECORD_KINDS for s in sides):
                    flag("kind-test", c, "compares a dict's 'kind' with an event or marker kind")
        if fn is tree:
            continue
        if _names_spec_file(body):
            calls = [a for a in body if isinstance(a, ast.Call)]
            typed = any(isinstance(a.func, ast.Attribute) and a.func.attr == "from_json"
                        for a in calls)
            for a in calls:
                fname = a.func.attr if isinstance(a.func, ast.Attribute) else \
                    getattr(a.func, "id", "")
                parses = fname in ("loads", "load", "read_json") and not typed
                dumps = fname in ("dumps", "dump", "atomic_write_json") and \
                    any(isinstance(x, ast.Dict) for x in a.args)
                if parses or dumps:
                    flag("spec-json", a, f"{fname}() of spec.json without RunSpec")
        names_events = any(
            (isinstance(a, ast.Attribute) and a.attr == "EVENTS_FILE")
            or (isinstance(a, ast.Constant) and isinstance(a.value, str)
                and "events.jsonl" in a.value and not a.value.strip().count(" "))
            for a in body)
        parses = [a for a in body if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute)
                  and a.func.attr in ("loads", "load") and getattr(a.func.value, "id", "") == "json"]
        if names_events and parses:
            flag("events-json", parses[0], "json.loads in a function that reads events.jsonl")
    return out


def scan(root: Path) -> list[str]:
    out: list[str] = []
    for top in SCANNED:
        for p in sorted((root / top).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            out += violations(p.read_text(), rel)
    return sorted(set(out))


def test_no_module_outside_the_contract_builds_or_indexes_event_or_wire_records():
    found = scan(REPO)
    assert not found, "\n".join(found)


def test_runstate_has_no_event_helpers():
    assert not RUNSTATE_EVENT_API & set(vars(runstate))


# --- the rules find what they are for ---------------------------------------------------------

BEFORE = {
    "emit": ('orchestrator/supervisor/x.py', '''
        def f(self, n):
            self.emit("stopping", attempt=n, reason="r")
            sup.emit(kind, **fields)
    '''),
    "kind-call": ('orchestrator/plan/x.py', '''
        rec = rs.event("final", status="done", reason="r")
        evs = [("group_decision", {"attempt": 1})]
    '''),
    "kind-dict": ('orchestrator/x.py', '''
        LINE = {"kind": "attempt_start", "attempt": 1}
    '''),
    "kind-test": ('orchestrator/cli/x.py', '''
        def show(ln):
            e = ln.event
            kind, a = e.get("kind"), e.get("attempt")
            if kind == "final":
                pass
            return [x for x in evs if x["kind"] in ("fallback", "restart")]
    '''),
    "events-json": ('orchestrator/engine/x.py', '''
        def deliver(self, name, text):
            if name == rs.EVENTS_FILE:
                return json.loads(text)
    '''),
    "wire": ('orchestrator/engine/x.py', '''
        ARGV = ["-m", "orchestrator.supervisor.follow"]
        def handle(rec):
            if "f" in rec:
                return rec["o"], rec.get("l")
            _emit({"end": "lost"})
    '''),
    "spec-index": ('orchestrator/supervisor/x.py', '''
        def start(self):
            if self.spec.get("byo"):
                return [self.spec["python"], "-m", "trainer"]
    '''),
    "spec-json": ('orchestrator/engine/x.py', '''
        def write(self, run_dir, spec):
            self.t.put(f"{run_dir}/{rs.SPEC_FILE}", json.dumps({"run_id": spec.run_id}))
        def read(run_dir):
            spec = read_json(os.path.join(run_dir, rs.SPEC_FILE))
            return spec
    '''),
    "runstate-events": ('orchestrator/cli/x.py', '''
        from dfo_contract import runstate as rs
        from dfo_contract.runstate import describe_event
        line = rs.describe_event(e)
    '''),
}


@pytest.mark.parametrize("rule", sorted(BEFORE))
def test_each_rule_finds_hand_built_records(rule):
    path, src = BEFORE[rule]
    found = violations(textwrap.dedent(src), path)
    assert any(f": {rule}: " in v for v in found), found


def test_a_marker_kind_test_is_flagged():
    src = textwrap.dedent('''
        def feed(rec):
            if rec.get("kind") == "checkpoint" or rec.get("kind") in ("step", "eval"):
                pass
    ''')
    found = [v.split(": ")[1] for v in violations(src, "orchestrator/plan/x.py")]
    assert found and set(found) == {"kind-test"}, found


def test_typed_events_and_markers_are_not_flagged():
    src = textwrap.dedent('''
        def feed(m, e):
            if isinstance(m, StepMarker) and m.KIND == "step":
                pass
            sup.emit(events.Final(status="done", reason="r", last_checkpoint=None))
            if isinstance(e, events.Final) and e.kind == "final":
                pass
            box["eof"] = True
            py = self.spec.identity.python
            nodes = pip_spec.get("nodes")
    ''')
    assert violations(src, "orchestrator/supervisor/x.py") == []
