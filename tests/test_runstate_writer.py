"""A run's ``state.json`` has one writer: ``orchestrator/supervisor/record.py``
(``RunRecord``'s transitions). No other module of ``orchestrator/`` changes a
``RunState`` (``dfo_contract.runstate``) or one of its attempts; they read it.

The rule is checked on the AST of every module under ``orchestrator/``. A write is an
assignment, an augmented or annotated assignment or a ``del`` whose target reaches a field
of a state or of an attempt (``state.status = ...``, ``state.ladder_pos[c] = ...``,
``att.cls, att.reason = ...``), a call of a mutating method on such a field
(``state.attempts.append(...)``, ``state.extra.pop(...)``), ``setattr``/``delattr`` on a
state or an attempt, or a record's state replaced (``record.state = ...``).

What counts as a state: an attribute named ``state`` (``self.state``,
``self.i.record.state``) when the next name is one of ``RunState``'s fields; a name bound
from one (``state = self.state``, ``i, st = self.i, rec.state``), from ``RunState(...)``
or ``RunState.new(...)``, from ``read_state``/``read_state_or_events``, or a parameter
annotated ``RunState``. An attempt: a name bound from a state's ``attempts[...]`` or
``current``, from ``Attempt(...)``, or iterated from a state's ``attempts``. A name bound
from a field of either (``bstate = state.budget``) is a part of it: a write through it is
a write to the state.

``BUILDERS`` are modules that build a fresh state of their own, never the live one (the
state told by ``events.jsonl``), and may fill in what they build.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from dfo_contract.runstate import Attempt, RunState

REPO = Path(__file__).resolve().parent.parent
#: the one module that writes the live run's state
WRITER = "orchestrator/supervisor/record.py"
#: modules that build a new RunState of their own from the run's files (pure)
BUILDERS = {
    "orchestrator/supervisor/policy/runstate_replay.py": "state.json told by events.jsonl",
}

STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(RunState))
ATTEMPT_FIELDS = frozenset(f.name for f in dataclasses.fields(Attempt))
MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update",
                      "setdefault", "popitem", "sort", "reverse", "add", "discard",
                      "__setitem__", "__delitem__", "__iadd__"})
#: calls whose value is a state (or a tuple whose first item is one)
STATE_CALLS = frozenset({"RunState", "new", "from_json", "read_state", "read_state_or_events"})
#: names a RunRecord goes by (``record.state = ...`` replaces the live state)
RECORD_NAMES = frozenset({"record", "rec"})

#: what a name holds: a state, one of its attempts, or a part of either (``state.budget``)
STATE, ATTEMPT, PART = "state", "attempt", "part"


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            if f.attr in ("new", "from_json"):   # RunState.new / RunState.from_json only
                return f.attr if isinstance(f.value, ast.Name) and f.value.id == "RunState" \
                    else None
            return f.attr
    return None


class _Scope:
    """The names of one function (or module) that hold a state or an attempt."""

    def __init__(self, node: ast.AST):
        self.node = node
        self.names: dict[str, str] = {}
        args = getattr(node, "args", None)
        if isinstance(args, ast.arguments):
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                ann = a.annotation
                text = ast.unparse(ann) if ann is not None else ""
                if text.strip("'\"").split(".")[-1] == "RunState":
                    self.names[a.arg] = STATE
        changed = True
        while changed:    # bindings may follow one another (att = state.attempts[-1])
            changed = False
            for sub in ast.walk(node):
                for name, kind in self._bindings(sub):
                    if name not in self.names:   # a name's first kind found stays
                        self.names[name] = kind
                        changed = True

    # --- what an expression is ----------------------------------------------------------------
    def kind(self, e: ast.AST) -> str | None:
        """STATE, ATTEMPT or None for an expression (as a whole)."""
        if isinstance(e, ast.Name):
            return self.names.get(e.id)
        if isinstance(e, ast.Attribute):
            if e.attr == "current" and self.kind(e.value) == STATE:
                return ATTEMPT
            return None
        if isinstance(e, ast.Subscript):
            v = e.value
            if isinstance(v, ast.Attribute) and v.attr == "attempts" \
                    and self.holder(v.value) == STATE:
                return ATTEMPT
            return None
        name = _call_name(e)
        if name in STATE_CALLS:
            return STATE
        if name == "Attempt":
            return ATTEMPT
        return None

    def holder(self, e: ast.AST) -> str | None:
        """STATE or ATTEMPT when ``e`` is one, or an attribute named ``state`` (what the
        next name says: the caller checks it is a field)."""
        k = self.kind(e)
        if k is not None:
            return k
        if isinstance(e, ast.Attribute) and e.attr == "state":
            return STATE
        return None

    def reaches_field(self, e: ast.AST) -> bool:
        """``e`` is a field of a state or an attempt, or a part of one (``state.budget``,
        ``state.ladder_pos[c]``, ``att.overrides``, ``state.budget.counts``)."""
        while isinstance(e, (ast.Attribute, ast.Subscript)):
            v = e.value
            if isinstance(v, ast.Name) and self.names.get(v.id) == PART:
                return True
            if isinstance(e, ast.Attribute):
                h = self.holder(v)
                if (h == STATE and e.attr in STATE_FIELDS) or \
                        (h == ATTEMPT and e.attr in ATTEMPT_FIELDS):
                    return True
            e = v
        return False

    def _bindings(self, node: ast.AST):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                yield from self._bind(t, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            yield from self._bind(node.target, node.value)
        elif isinstance(node, (ast.For, ast.comprehension)):
            it = node.iter
            if isinstance(it, ast.Attribute) and it.attr == "attempts" \
                    and self.holder(it.value) == STATE and isinstance(node.target, ast.Name):
                yield node.target.id, ATTEMPT

    def _bind(self, target: ast.AST, value: ast.AST):
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    yield from self._bind(t, v)
            elif _call_name(value) in STATE_CALLS and target.elts:   # state, damage = ...
                first = target.elts[0]
                if isinstance(first, ast.Name):
                    yield first.id, STATE
            return
        if not isinstance(target, ast.Name):
            return
        if isinstance(value, ast.Attribute) and value.attr == "state":
            yield target.id, STATE
            return
        k = self.kind(value)
        if k is not None:
            yield target.id, k
        elif self.reaches_field(value):
            yield target.id, PART

    # --- the writes -----------------------------------------------------------------------------
    def writes(self) -> list[ast.AST]:
        found = []
        for sub in ast.walk(self.node):
            targets: list[ast.AST] = []
            if isinstance(sub, ast.Assign):
                targets = list(sub.targets)
            elif isinstance(sub, (ast.AugAssign, ast.AnnAssign)):
                targets = [sub.target]
            elif isinstance(sub, ast.Delete):
                targets = list(sub.targets)
            for t in _flatten(targets):
                if self.reaches_field(t) or _replaces_record_state(t):
                    found.append(t)
            if isinstance(sub, ast.Call):
                f = sub.func
                if isinstance(f, ast.Attribute) and f.attr in MUTATORS \
                        and self.reaches_field(f.value):
                    found.append(sub)
                elif isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and sub.args \
                        and self.holder(sub.args[0]) is not None:
                    found.append(sub)
        return found


def _flatten(targets: list[ast.AST]) -> list[ast.AST]:
    out: list[ast.AST] = []
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            out += _flatten(list(t.elts))
        elif isinstance(t, ast.Starred):
            out += _flatten([t.value])
        else:
            out.append(t)
    return out


def _replaces_record_state(t: ast.AST) -> bool:
    if not (isinstance(t, ast.Attribute) and t.attr == "state"):
        return False
    v = t.value
    last = v.attr if isinstance(v, ast.Attribute) else v.id if isinstance(v, ast.Name) else ""
    return last in RECORD_NAMES


def state_writes(source: str, path: str = "<src>") -> list[str]:
    """``path:line: code`` for every write to a RunState (or one of its attempts) in
    ``source``."""
    tree = ast.parse(source, path)
    scopes = [tree, *(n for n in ast.walk(tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]
    seen: dict[tuple[int, int], str] = {}
    for node in scopes:
        for w in _Scope(node).writes():
            key = (w.lineno, w.col_offset)
            seen.setdefault(key, f"{path}:{w.lineno}: {ast.unparse(w)}")
    return [seen[k] for k in sorted(seen)]


def writes_outside_the_writer(root: Path = REPO) -> list[str]:
    out: list[str] = []
    for p in sorted((root / "orchestrator").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel == WRITER or rel in BUILDERS:
            continue
        out += state_writes(p.read_text(encoding="utf-8"), rel)
    return out


# --- the rule -------------------------------------------------------------------------------

def test_only_the_run_record_writes_the_run_state():
    assert writes_outside_the_writer() == []


def test_the_exempt_modules_exist():
    assert (REPO / WRITER).is_file()
    for rel in BUILDERS:
        assert (REPO / rel).is_file(), f"{rel} is gone: take it off BUILDERS"


# --- what the rule sees ---------------------------------------------------------------------

def _w(src: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in state_writes(src)]


def test_the_rule_sees_writes_through_the_record_and_through_names():
    src = (
        "def f(self, rec, n):\n"
        "    self.state.status = 'backoff'\n"
        "    self.record.state.attempt = n\n"
        "    rec.state.throughput_low = None\n"
        "    st = rec.state\n"
        "    st.last_step, st.tokens_per_s = 1, 2.0\n"
        "    i, state, sb = self.i, self.i.record.state, self.i.standby\n"
        "    state.ladder_pos['oom'] = 2\n"
        "    state.budget.total += 1\n"
        "    del state.extra['x']\n"
        "    state.attempts.append(n)\n"
        "    state.extra.pop('argv', None)\n"
        "    att = state.attempts[-1]\n"
        "    att.cls, att.reason = 'oom', 'x'\n"
        "    cur = state.current\n"
        "    cur.ended_at = 1.0\n"
        "    for a in state.attempts:\n"
        "        a.pid = None\n"
        "    bstate = state.budget\n"
        "    bstate.counts['oom'] = 1\n"
        "    setattr(self.record.state, 'standby_pid', n)\n"
        "    self.record.state, damage = load()\n")
    assert _w(src) == [
        "self.state.status", "self.record.state.attempt", "rec.state.throughput_low",
        "st.last_step", "st.tokens_per_s", "state.ladder_pos['oom']", "state.budget.total",
        "state.extra['x']", "state.attempts.append(n)", "state.extra.pop('argv', None)",
        "att.cls", "att.reason", "cur.ended_at", "a.pid", "bstate.counts['oom']",
        "setattr(self.record.state, 'standby_pid', n)", "self.record.state"]


def test_the_rule_sees_states_read_or_made_and_annotated():
    src = (
        "def f(run_dir, given: RunState, other: 'RunState'):\n"
        "    state, damage = read_state_or_events(run_dir)\n"
        "    state.status = 'lost'\n"
        "    fresh = RunState(run_id='r')\n"
        "    fresh.pid = 1\n"
        "    given.last_step = 3\n"
        "    other.reason = 'x'\n"
        "    one = Attempt(n=1, started_at=0.0)\n"
        "    one.pid = 2\n")
    assert _w(src) == ["state.status", "fresh.pid", "given.last_step", "other.reason", "one.pid"]


def test_the_rule_leaves_reads_and_other_states_alone():
    src = (
        "def f(self, rec, facts, st):\n"
        "    n = rec.state.attempt + 1\n"
        "    state = rec.state\n"
        "    x = state.attempts[-1].cls\n"
        "    self.state = {}\n"                 # another class's own ``state``
        "    self.state['h'] = 'ok'\n"
        "    facts.state = parse()\n"
        "    st.state = 'R'\n"                  # a process's state, not a field of a RunState
        "    proc.state.nothing_of_a_run = 1\n"
        "    shown = dataclasses.replace(state, status='lost')\n"
        "    overrides = dict(state.overrides)\n"
        "    overrides['x'] = 1\n"
        "    step = state.last_step\n"
        "    step += 1\n"
        "    rec.progress(3, 1.0, None)\n")
    assert _w(src) == []
