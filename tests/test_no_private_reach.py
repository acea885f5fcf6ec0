"""No private reach-ins in ``orchestrator/`` and ``dfo_contract/``, and no mixins in the engine.

Checked on the AST of every ``.py`` file of those trees:

(a) an attribute ``X._name`` (not a dunder) is read or written only on ``self``, ``cls`` or
    ``super()``, or when ``_name`` is a private member of a class of the same module (a
    method, class attribute or ``self._name`` that one of its classes defines): an object
    of the module's own classes. Anything else is a reach into another class's or another
    module's internals, unless it is in ``ALLOWED_ATTRS`` (each with its reason).
(b) no ``from m import _name``: a name another module uses is public.
(c) no class of ``orchestrator/engine/`` is named ``...Mixin`` or has a base class defined in
    ``orchestrator/engine/``: an engine class holds the objects it uses (composition) and
    passes them what they need through their constructors.
(d) no engine class hands itself to the constructor of another engine class (``Helper(self)``,
    ``Helper(run=self.run)``): a helper never holds its parent; the parts both use are built
    once and given to each.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("orchestrator", "dfo_contract")
ENGINE = REPO / "orchestrator" / "engine"

#: ``X._name`` allowed anywhere: (X as written, name) -> why
ALLOWED_ATTRS: dict[tuple[str, str], str] = {
    ("os", "_exit"): "stdlib: leave a forked child without running its parent's cleanup",
    ("chan.transport", "_send_user_message"):
        "paramiko has no public call for a channel's RFC 4254 \"signal\" request (transport/ssh.py)",
}


def _files(roots=ROOTS) -> list[Path]:
    out = []
    for root in roots:
        out += [p for p in sorted((REPO / root).rglob("*.py")) if "__pycache__" not in p.parts]
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_private_members(tree: ast.Module) -> set[str]:
    """Private names the module's own classes define: methods, class attributes and
    ``self._x`` assignments."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
                names.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                  and _private(node.attr)):
                names.add(node.attr)
    return names


def _owner(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super"):
        return "super()"
    return ast.unparse(node)


def private_reaches(source: str, rel: str) -> list[str]:
    """Every reach-in of (a) and (b) in one module's ``source`` (``rel``: its path)."""
    tree = ast.parse(source, rel)
    own = _own_private_members(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _owner(node.value)
            if owner in ("self", "cls", "super()") or node.attr in own:
                continue
            if (owner, node.attr) in ALLOWED_ATTRS:
                continue
            found.append(f"{rel}:{node.lineno}: {owner}.{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{rel}:{node.lineno}: from {'.' * node.level}"
                                 f"{node.module or ''} import {alias.name}")
    return found


def test_no_private_reach_ins():
    found = [x for p in _files()
             for x in private_reaches(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "private names used from outside their class or module:\n" + "\n".join(found)


def test_every_allowed_reach_is_still_there():
    """An allowlist entry whose use is gone is removed with it."""
    used = set()
    for p in _files():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                used.add((_owner(node.value), node.attr))
    assert not set(ALLOWED_ATTRS) - used, f"unused entries: {sorted(set(ALLOWED_ATTRS) - used)}"


def _engine_classes() -> dict[str, Path]:
    out = {}
    for p in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ClassDef):
                out[node.name] = p
    return out


def test_engine_has_no_mixins():
    engine = _engine_classes()
    bad = []
    for p in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(node, ast.ClassDef):
                continue
            rel = p.relative_to(REPO)
            if node.name.endswith("Mixin"):
                bad.append(f"{rel}:{node.lineno}: class {node.name} is a mixin")
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else (
                    base.attr if isinstance(base, ast.Attribute) else None)
                if name in engine:
                    bad.append(f"{rel}:{node.lineno}: class {node.name} inherits {name} "
                               f"({engine[name].relative_to(REPO)}): hold it instead")
    assert not bad, "\n".join(bad)


def test_the_checks_see_what_they_forbid():
    """The checker itself: each kind of reach-in is found, the allowed forms are not."""
    src = (
        "from m import _hidden, shown\n"
        "import os\n"
        "import mod\n"
        "class A:\n"
        "    _LIMIT = 3\n"
        "    def __init__(self, b):\n"
        "        self._mine = 1\n"
        "        self.b = b\n"
        "    def _helper(self):\n"
        "        return self._mine, self.__class__, os._exit, A._LIMIT\n"
        "    def use(self, other: 'A'):\n"
        "        return other._helper(), other._mine, self.b._theirs, super()._x, mod._f()\n"
    )
    assert sorted(private_reaches(src, "x.py")) == [
        "x.py:12: mod._f",
        "x.py:12: self.b._theirs",
        "x.py:1: from m import _hidden",
    ]


def _methods(cls: ast.ClassDef) -> set[str]:
    """The methods of ``cls`` that a bound ``self.name`` would hand out (not properties)."""
    out = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not any(
                isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            out.add(node.name)
    return out


def back_pointers(source: str, rel: str, engine: set[str]) -> list[str]:
    """Every call in ``source`` where a class hands itself to the constructor of a class in
    ``engine``: ``self`` as an argument, or one of its own bound methods (``self.run``),
    anywhere inside the arguments (a lambda's body included; a call's result is not
    itself). The object built would then hold its builder: a helper holding its parent."""
    found = []
    for cls in (n for n in ast.walk(ast.parse(source, rel)) if isinstance(n, ast.ClassDef)):
        methods = _methods(cls)
        for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            f = call.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name not in engine:
                continue
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                parents = {id(c): p for p in ast.walk(arg) for c in ast.iter_child_nodes(p)}
                in_lambda = {id(n) for lam in ast.walk(arg) if isinstance(lam, ast.Lambda)
                             for n in ast.walk(lam.body)}
                for node in ast.walk(arg):
                    if not (isinstance(node, ast.Name) and node.id == "self"):
                        continue
                    up = parents.get(id(node))
                    if isinstance(up, ast.Attribute) and up.value is node:
                        called = parents.get(id(up))
                        if up.attr not in methods or (isinstance(called, ast.Call)
                                                      and called.func is up
                                                      and id(node) not in in_lambda):
                            continue     # a part it holds (self.clock), or a call's result
                        what = f"self.{up.attr}"
                    else:
                        what = "self"
                    found.append(f"{rel}:{call.lineno}: {cls.name} gives {what} to {name}")
    return found


def test_engine_helpers_hold_no_parent():
    """An engine class builds the parts it holds from what it has, never from itself: no
    ``Helper(self)``, no ``Helper(run=self.run)``. A part both sides use is built once and
    given to each (``CacheStore``, ``DeployProbe``), so no helper holds its parent."""
    engine = set(_engine_classes())
    found = [x for p in sorted(ENGINE.rglob("*.py"))
             for x in back_pointers(p.read_text(), str(p.relative_to(REPO)), engine)]
    assert not found, "engine helpers holding their parent:\n" + "\n".join(found)


def test_the_back_pointer_check_sees_it():
    src = (
        "class Helper:\n"
        "    def __init__(self, parent=None, run=None, clock=None):\n"
        "        self.parent = parent\n"
        "class Parent:\n"
        "    def __init__(self, clock):\n"
        "        self.clock = clock\n"
        "        self.a = Helper(self)\n"
        "        self.b = Helper(run=self.run)\n"
        "        self.c = Helper(clock=self.clock, run=lambda: self.run())\n"
        "        self.d = Helper(clock=self.clock, run=print)\n"
        "        self.e = Helper(self.run(), clock=self.clock.now())\n"
        "    @property\n"
        "    def size(self):\n"
        "        return Helper(clock=self.size)\n"
        "    def run(self):\n"
        "        pass\n"
    )
    assert back_pointers(src, "x.py", {"Helper"}) == [
        "x.py:7: Parent gives self to Helper",
        "x.py:8: Parent gives self.run to Helper",
        "x.py:9: Parent gives self.run to Helper",
    ]
