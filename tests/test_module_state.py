"""No trainer module keeps mutable process state of its own.

Process state (the compile registry, the compile gate, fault injection, attention's
warn-once) lives on objects the entry point builds once and passes down
(trainer.core.runtime.Runtime), as the environment does (trainer.env.read_env). A module
breaks that rule, read from its source (``state_findings``), when it has:

- a ``global`` statement anywhere;
- a module-level name bound to a mutable container (a dict/list/set display or
  comprehension, or ``dict()``/``list()``/``set()``/``defaultdict()``/``deque()``/...),
  unless it is a constant: an UPPER_CASE or dunder name that the module never mutates
  (no item or slice assignment, no ``del NAME[...]``, no augmented assignment, no call of a
  mutating method such as ``append``/``update``/``clear`` on it);
- a module-level name bound to an instance: a call of a class the module defines, or of a
  stateful standard-library factory (``threading.Lock``/``RLock``/``Event``/``local``,
  ``queue.Queue``, ``itertools.count``, weak containers, ...).

``KNOWN_STATE`` lists what the trainer still keeps, with why; it only shrinks: an entry
whose state is gone fails the test until it is removed, and new state fails it at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MUTABLE_FACTORIES = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "deque",
                               "Counter", "ChainMap", "bytearray"})
STATEFUL_FACTORIES = frozenset({"Lock", "RLock", "Event", "local", "Condition", "Semaphore",
                                "BoundedSemaphore", "Queue", "SimpleQueue", "count",
                                "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"})
MUTATING_METHODS = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear",
                              "update", "setdefault", "add", "discard", "appendleft",
                              "extendleft", "sort", "reverse", "difference_update",
                              "intersection_update", "symmetric_difference_update"})

#: (file, name) -> why the module still holds it; being removed, never added to
KNOWN_STATE: dict[tuple[str, str], str] = {
    ("trainer/data/pool.py", "_W"):
        "a data worker process's masker, set by the multiprocessing pool's initializer",
}


def _callee(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    return f.attr if isinstance(f, ast.Attribute) else None


def _is_constant_name(name: str) -> bool:
    return name.isupper() or (name.startswith("__") and name.endswith("__"))


def _top_level(body: list[ast.stmt]):
    """Module-level statements, those inside top-level ``if``/``try`` blocks included."""
    for s in body:
        yield s
        if isinstance(s, ast.If):
            yield from _top_level(s.body)
            yield from _top_level(s.orelse)
        elif isinstance(s, ast.Try):
            for part in (s.body, s.orelse, s.finalbody, *[h.body for h in s.handlers]):
                yield from _top_level(part)


def _mutated_names(tree: ast.Module) -> set[str]:
    """Names the module mutates in place anywhere (item/slice/attribute stores, ``del``
    of an item, augmented assignment, mutating method calls)."""
    out: set[str] = set()

    def base(node) -> str | None:
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for n in ast.walk(tree):
        targets: list = []
        if isinstance(n, (ast.Assign, ast.Delete)):
            targets = n.targets
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        for t in targets:
            if isinstance(t, (ast.Subscript, ast.Attribute)) or isinstance(n, ast.AugAssign):
                b = base(t)
                if b:
                    out.add(b)
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in MUTATING_METHODS):
            b = base(n.func.value)
            if b:
                out.add(b)
    return out


def state_findings(source: str) -> list[tuple[str, str]]:
    """``(name, why)`` for each piece of mutable module state in ``source`` (see the module
    docstring); ``global`` statements are reported under ``global <names>``."""
    tree = ast.parse(source)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    mutated = _mutated_names(tree)
    out = [(f"global {', '.join(n.names)}", "a global statement")
           for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for s in _top_level(tree.body):
        if isinstance(s, ast.Assign):
            targets, value = s.targets, s.value
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            targets, value = [s.target], s.value
        else:
            continue
        for t in targets:
            if not isinstance(t, ast.Name):
                continue
            name = t.id
            container = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp,
                                           ast.ListComp, ast.SetComp)) or (
                isinstance(value, ast.Call) and _callee(value) in MUTABLE_FACTORIES)
            if container and not (_is_constant_name(name) and name not in mutated):
                out.append((name, "a mutable container"))
            elif isinstance(value, ast.Call) and (_callee(value) in STATEFUL_FACTORIES
                                                  or _callee(value) in classes):
                out.append((name, f"an instance ({_callee(value)})"))
    return out


def trainer_state(repo: Path = REPO) -> dict[tuple[str, str], str]:
    out = {}
    for p in sorted((repo / "trainer").rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(repo).as_posix()
        for name, why in state_findings(p.read_text()):
            out[(rel, name)] = why
    return out


def test_trainer_modules_keep_no_mutable_state():
    found = trainer_state()
    new = {k: v for k, v in found.items() if k not in KNOWN_STATE}
    assert not new, ("module-level state (hold it on an object the entry point builds and "
                     f"passes down, e.g. trainer.core.runtime.Runtime): {new}")
    gone = sorted(k for k in KNOWN_STATE if k not in found)
    assert not gone, f"remove these from KNOWN_STATE (their state is gone): {gone}"


def test_the_rule_flags_state_and_lets_constants_be():
    flagged = state_findings('''
import threading
from collections import deque

_CACHE = {}
_seen: list[str] = []
REGISTRY = dict()
LIMITS = {"a": 1}
LIMITS["b"] = 2
NAMES = [1, 2]

def remember(x):
    NAMES.append(x)
    _CACHE[x] = x

class State:
    pass

STATE = State()
_lock = threading.Lock()
_tl = threading.local()
_q = deque()
try:
    _opt = {}
except ImportError:
    pass

def bump():
    global COUNT
    COUNT += 1
''')
    assert sorted(n for n, _ in flagged) == sorted([
        "_CACHE", "_seen", "LIMITS", "NAMES", "STATE", "_lock", "_tl", "_q", "_opt",
        "global COUNT"])
    assert state_findings('''
import logging
from types import MappingProxyType

__all__ = ["f"]
KINDS = ("a", "b")
TABLE = {"a": 1, "b": 2}
_PRIVATE_TABLE = {"c": 3}
ORDER = ["x", "y"]
FROZEN = frozenset({"a"})
VIEW = MappingProxyType({"a": 1})
log = logging.getLogger("dfo")

def f(d):
    local = {}
    local["k"] = TABLE["a"]
    return local
''') == []
