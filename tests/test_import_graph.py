"""No file-level import circles: the import graph of the whole tree, built from the AST.

Nodes are the ``.py`` files of ``dfo_contract/``, ``trainer/``, ``orchestrator/`` and
``tests/`` (as modules: ``trainer/data/stream.py`` is ``trainer.data.stream``). Every
``import``/``from ... import`` statement anywhere in a file -- at module level, inside a
function, under ``if TYPE_CHECKING:`` -- is an edge from that file to the file it names:
``from pkg import name`` points at ``pkg/name.py`` when that is a module, else at
``pkg/__init__.py``; ``import a.b.c`` at the deepest of ``a.b.c``, ``a.b``, ``a`` that is a
file of the tree. The parents a dotted import runs as a side effect are not edges (a
package ``__init__`` that re-exports its modules would otherwise be a circle with each).

``trainer/`` and ``dfo_contract/`` must have no circle at all. ``orchestrator/`` may keep
only the circles of ``KNOWN_ORCHESTRATOR_CYCLES``; that list must shrink: an entry whose
circle is gone fails the test until it is removed, and a new circle fails it at once.

The trainer's parts point one way: ``TRAINER_ORDER`` lists its packages and top-level
modules lowest first, and a module may import only from its own part or one listed before
it. A part missing from the list fails the test, so a new package is placed on purpose.

The orchestrator is split by the process that runs it (``ORCHESTRATOR_SIDES``): the laptop's
``dfo`` (cli, engine, plan, config, transport), the container's programs (the supervisor and
its policy; the host tools of ``remote``) and the small ``common`` part both run. No laptop
module imports a container module or the other way round (``ALLOWED_CROSSINGS`` would name
an edge that may, with its reason; it names none); ``common`` imports only itself (and ``dfo_contract``); neither
``common`` nor the laptop imports the trainer. ``ORCHESTRATOR_ORDER`` lists the
orchestrator's parts lowest first, like ``TRAINER_ORDER``: an upward import fails, as does
a part it does not list, and the parts have no circle. The host tools whose source travels as
``python -c`` text import nothing of the tree.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("dfo_contract", "trainer", "orchestrator", "tests")
STRICT = ("dfo_contract", "trainer")

#: the trainer's parts (``trainer/<part>/`` or ``trainer/<part>.py``), lowest first: a module
#: imports only from its own part or from one before it (docs/architecture.md)
TRAINER_ORDER = ("env", "model", "compile", "data", "telemetry", "core", "parallel", "evaluate",
                 "train", "bench", "preload", "__main__")

#: the orchestrator's parts (``orchestrator/<part>/``; ``supervisor.policy`` is a part of its own),
#: lowest first: a module imports only from its own part or from one before it
ORCHESTRATOR_ORDER = ("common", "remote", "transport", "config", "plan", "engine", "cli",
                      "supervisor.policy", "supervisor")

#: which process runs each part (docs/architecture.md "Folders")
ORCHESTRATOR_SIDES = {
    "common": "shared",
    "transport": "laptop", "config": "laptop", "plan": "laptop", "engine": "laptop", "cli": "laptop",
    "remote": "container", "supervisor.policy": "container", "supervisor": "container",
}

#: imports across the process line that may stay, each with its reason (none: a laptop module
#: that needs a host tool's answer runs the tool, as the host does)
ALLOWED_CROSSINGS: dict[tuple[str, str], str] = {}

#: host tools whose source runs as ``python -c`` where dfo is not installed: stdlib only
REMOTE_SOURCE_TOOLS = ("orchestrator.remote.env_probe", "orchestrator.remote.cache_tool")

#: circles the orchestrator still has (each a set of modules); being removed, never added to
KNOWN_ORCHESTRATOR_CYCLES: list[frozenset[str]] = [
]


def module_files(repo: Path = REPO, roots=ROOTS) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``roots``."""
    out = {}
    for root in roots:
        for p in sorted((repo / root).rglob("*.py")):
            rel = p.relative_to(repo).with_suffix("")
            parts = list(rel.parts)
            if "__pycache__" in parts or any(not x.isidentifier() for x in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _base(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from`` statement imports from (relative levels resolved)."""
    if not node.level:
        return node.module
    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level - 1 > len(pkg):
        return None
    pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def _deepest(name: str, known) -> str | None:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in known:
            return cand
    return None


def imports_of(mod: str, path: Path, known) -> set[str]:
    """The modules of ``known`` that the file ``path`` (module ``mod``) imports, anywhere in it."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                t = _deepest(a.name, known)
                if t:
                    out.add(t)
        elif isinstance(node, ast.ImportFrom):
            base = _base(mod, is_pkg, node)
            if base is None:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                t = sub if sub in known else _deepest(base, known)
                if t:
                    out.add(t)
    out.discard(mod)
    return out


def import_graph(repo: Path = REPO, roots=ROOTS) -> dict[str, set[str]]:
    files = module_files(repo, roots)
    return {m: imports_of(m, p, files) for m, p in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def a_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One circle through ``comp``'s first module, as ``[a, b, ..., a]`` (shortest, BFS)."""
    start = min(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(comp)


def describe(graph, comp) -> str:
    return " -> ".join(a_cycle(graph, comp)) + f"  ({len(comp)} modules: {', '.join(sorted(comp))})"


@functools.lru_cache(maxsize=1)
def _whole_tree() -> dict[str, set[str]]:
    return import_graph()


def _in(comp: set[str], roots) -> bool:
    return any(m == r or m.startswith(r + ".") for m in comp for r in roots)


# --------------------------------------------------------------------------- the checks

def test_trainer_and_contract_have_no_import_circle():
    g = _whole_tree()
    bad = [describe(g, c) for c in strongly_connected(g) if _in(c, STRICT)]
    assert not bad, "import circles:\n" + "\n".join(bad)


def test_orchestrator_has_no_new_import_circle_and_the_known_list_shrinks():
    g = _whole_tree()
    comps = [c for c in strongly_connected(g) if not _in(c, STRICT)]
    new = [describe(g, c) for c in comps if not any(c <= k for k in KNOWN_ORCHESTRATOR_CYCLES)]
    assert not new, "new import circles:\n" + "\n".join(new)
    gone = [sorted(k) for k in KNOWN_ORCHESTRATOR_CYCLES if not any(len(c & k) > 1 for c in comps)]
    assert not gone, f"no longer circles: remove from KNOWN_ORCHESTRATOR_CYCLES: {gone}"


def test_the_tree_is_read_whole():
    g = _whole_tree()
    for m in ("trainer.__main__", "trainer.env", "dfo_contract.fsio", "orchestrator.cli",
              "tests.helpers.trainer"):
        assert m in g
    assert len([m for m in g if m.startswith("trainer.")]) > 40


def part_of(mod: str, root: str = "trainer") -> str | None:
    """The part of ``root`` that module ``mod`` belongs to (None: ``root``'s ``__init__``)."""
    parts = mod.split(".")
    return parts[1] if parts[0] == root and len(parts) > 1 else None


def upward_arrows(graph: dict[str, set[str]], order, root: str = "trainer") -> list[str]:
    """Every import from a part of ``root`` to a part listed after it in ``order``, and every
    part that ``order`` does not list, as readable lines."""
    rank = {p: i for i, p in enumerate(order)}
    bad = []
    for m in sorted(graph):
        src = part_of(m, root)
        if m.split(".")[0] != root or src is None:
            continue
        if src not in rank:
            bad.append(f"{m}: part {src!r} is not in the order {order}")
            continue
        for t in sorted(graph[m]):
            dst = part_of(t, root)
            if dst is not None and dst != src and dst in rank and rank[dst] > rank[src]:
                bad.append(f"{m} -> {t}  ({src} imports {dst}, which is above it)")
    return bad


def part_graph(graph: dict[str, set[str]], root: str = "trainer") -> dict[str, set[str]]:
    """The graph between ``root``'s parts (a part's own imports dropped)."""
    out: dict[str, set[str]] = {}
    for m, ts in graph.items():
        src = part_of(m, root)
        if m.split(".")[0] != root or src is None:
            continue
        out.setdefault(src, set())
        for t in ts:
            dst = part_of(t, root)
            if t.split(".")[0] == root and dst is not None and dst != src:
                out[src].add(dst)
                out.setdefault(dst, set())
    return out


def test_trainer_parts_point_one_way():
    g = _whole_tree()
    bad = upward_arrows(g, TRAINER_ORDER)
    assert not bad, "upward imports between the trainer's parts:\n" + "\n".join(bad)
    pg = part_graph(g)
    circles = [describe(pg, c) for c in strongly_connected(pg)]
    assert not circles, "circles between the trainer's parts:\n" + "\n".join(circles)
    assert set(pg) == set(TRAINER_ORDER), f"parts listed but absent: {set(TRAINER_ORDER) - set(pg)}"


def orchestrator_part(mod: str, order=ORCHESTRATOR_ORDER, root: str = "orchestrator") -> str | None:
    """The part of ``order`` that module ``mod`` of ``root`` belongs to: the longest listed
    prefix (``supervisor.policy`` before ``supervisor``); its first package when none is listed;
    None for ``root``'s own ``__init__``."""
    parts = mod.split(".")
    if parts[0] != root or len(parts) == 1:
        return None
    rest = parts[1:]
    for n in range(len(rest), 0, -1):
        if ".".join(rest[:n]) in order:
            return ".".join(rest[:n])
    return rest[0]


def orchestrator_upward(graph: dict[str, set[str]], order=ORCHESTRATOR_ORDER,
                        root: str = "orchestrator") -> list[str]:
    """Every import from a part of ``root`` to a part listed after it in ``order``, and every
    module of a part that ``order`` does not list (or directly in ``root``), as readable lines."""
    rank = {p: i for i, p in enumerate(order)}
    bad = []
    for m in sorted(graph):
        if m.split(".")[0] != root or m == root:
            continue
        src = orchestrator_part(m, order, root)
        if src not in rank:
            bad.append(f"{m}: part {src!r} is not in the order {order}")
            continue
        for t in sorted(graph[m]):
            dst = orchestrator_part(t, order, root)
            if t.split(".")[0] != root or dst is None or dst == src:
                continue
            if dst not in rank or rank[dst] > rank[src]:
                bad.append(f"{m} -> {t}  ({src} imports {dst}, which is above it)")
    return bad


def process_crossings(graph: dict[str, set[str]], sides=None, allowed=None, order=ORCHESTRATOR_ORDER,
                      root: str = "orchestrator", trainer: str = "trainer") -> list[str]:
    """Every import across the process line, as readable lines: a laptop module importing a
    container module or the other way round (``allowed`` edges excepted), the shared part
    importing anything of ``root`` outside itself, and the laptop or shared part importing
    the trainer."""
    sides = ORCHESTRATOR_SIDES if sides is None else sides
    allowed = ALLOWED_CROSSINGS if allowed is None else allowed
    bad = []
    for m in sorted(graph):
        if m.split(".")[0] != root:
            continue
        src = sides.get(orchestrator_part(m, order, root) or "")
        for t in sorted(graph[m]):
            if t.split(".")[0] == trainer and src in ("laptop", "shared"):
                bad.append(f"{m} -> {t}  (the {src} part imports the trainer)")
                continue
            if t.split(".")[0] != root or (m, t) in allowed:
                continue
            dst = sides.get(orchestrator_part(t, order, root) or "")
            if src == "shared" and dst != "shared":
                bad.append(f"{m} -> {t}  (the shared part imports the {dst} part)")
            elif {src, dst} == {"laptop", "container"}:
                bad.append(f"{m} -> {t}  ({src} imports {dst})")
    return bad


def orchestrator_part_graph(graph: dict[str, set[str]], order=ORCHESTRATOR_ORDER,
                            root: str = "orchestrator") -> dict[str, set[str]]:
    """The graph between ``root``'s parts (a part's own imports dropped)."""
    out: dict[str, set[str]] = {}
    for m, ts in graph.items():
        src = orchestrator_part(m, order, root)
        if src is None:
            continue
        out.setdefault(src, set())
        for t in ts:
            dst = orchestrator_part(t, order, root)
            if dst is not None and dst != src:
                out[src].add(dst)
    return out


def test_orchestrator_parts_point_one_way_and_no_package_circle():
    g = _whole_tree()
    bad = orchestrator_upward(g)
    assert not bad, "upward imports between the orchestrator's parts:\n" + "\n".join(bad)
    pg = orchestrator_part_graph(g)
    circles = [describe(pg, c) for c in strongly_connected(pg)]
    assert not circles, "circles between the orchestrator's parts:\n" + "\n".join(circles)
    assert set(pg) == set(ORCHESTRATOR_ORDER) == set(ORCHESTRATOR_SIDES), \
        f"parts listed but absent: {set(ORCHESTRATOR_ORDER) - set(pg)}"


def test_no_import_crosses_the_process_line():
    g = _whole_tree()
    bad = process_crossings(g)
    assert not bad, "imports across the process line:\n" + "\n".join(bad)
    stale = [e for e in ALLOWED_CROSSINGS if e[1] not in g.get(e[0], ())]
    assert not stale, f"no longer imported: remove from ALLOWED_CROSSINGS: {stale}"


def test_the_entry_points_reach_only_their_side():
    """From ``python -m orchestrator.supervisor`` (and the host tools) no laptop module is
    reached, and from the ``dfo`` command no container module (the allowed crossings aside)."""
    g = _whole_tree()

    def reach(starts):
        seen, todo = set(), list(starts)
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(t for t in g.get(m, ()) if (m, t) not in ALLOWED_CROSSINGS)
        return seen

    def side(m):
        return ORCHESTRATOR_SIDES.get(orchestrator_part(m) or "")

    container = reach([m for m in g if m.startswith(("orchestrator.supervisor", "orchestrator.remote"))])
    laptop = reach(["orchestrator.cli", "orchestrator.cli.__main__"])
    assert "orchestrator.supervisor.__main__" in container and "orchestrator.engine.runs" in laptop
    assert not {m for m in container if side(m) == "laptop"}
    assert not {m for m in laptop if side(m) == "container"}
    assert {m for m in container & laptop if m.startswith("orchestrator.")} <= \
        {m for m in g if side(m) == "shared"}


def test_remote_source_tools_are_self_contained():
    g = _whole_tree()
    for m in REMOTE_SOURCE_TOOLS:
        assert m in g
        assert not {t for t in g[m] if t.split(".")[0] in ("orchestrator", "dfo_contract")}, (m, g[m])


# --------------------------------------------------------------------------- the graph itself

def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, body in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    return import_graph(tmp_path, ("pkg",))


def test_edges_module_and_function_level_relative_and_absolute(tmp_path: Path):
    g = _tree(tmp_path, {
        "pkg/__init__.py": "from .a import x\n",
        "pkg/a.py": "import pkg.sub.b\nx = 1\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from .. import c\n    from ..a import x\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\n"
                    "import os, json\n",
        "pkg/d.py": "from pkg import sub\nfrom pkg.sub import nothing_here\n",
    })
    assert g["pkg"] == {"pkg.a"}
    assert g["pkg.a"] == {"pkg.sub.b"}             # the deepest file, not its parents
    assert g["pkg.sub.b"] == {"pkg.c", "pkg.a"}    # function-level, relative
    assert g["pkg.c"] == {"pkg.sub.b"}             # TYPE_CHECKING counts; stdlib is not a node
    assert g["pkg.d"] == {"pkg.sub"}               # a name that is no module: its package


def test_cycle_found_and_named(tmp_path: Path):
    g = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .c import y\n",
        "pkg/c.py": "import pkg.a\ny = 1\n",
        "pkg/d.py": "from . import a\n",
    })
    (comp,) = strongly_connected(g)
    assert comp == {"pkg.a", "pkg.b", "pkg.c"}
    assert a_cycle(g, comp) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert describe(g, comp).startswith("pkg.a -> pkg.b -> pkg.c -> pkg.a")


def test_two_module_cycle_and_no_false_cycle(tmp_path: Path):
    g = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import x\n",
                         "pkg/b.py": "from .a import y\n", "pkg/c.py": "from . import a, b\n"})
    (comp,) = strongly_connected(g)
    assert a_cycle(g, comp) == ["pkg.a", "pkg.b", "pkg.a"]
    g2 = _tree(tmp_path / "t2", {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n",
                                 "pkg/b.py": "x = 1\n"})
    assert strongly_connected(g2) == []


def test_upward_arrow_and_unlisted_part_are_named(tmp_path: Path):
    g = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "def f():\n    from ..high.b import x\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from ..low import a\nfrom . import c\nx = 1\n",
        "pkg/high/c.py": "",
        "pkg/top.py": "from pkg.high import b\n",
        "pkg/stray/__init__.py": "from pkg.low import a\n",
    })
    bad = upward_arrows(g, ("low", "high", "top"), root="pkg")
    assert bad == ["pkg.low.a -> pkg.high.b  (low imports high, which is above it)",
                   "pkg.stray: part 'stray' is not in the order ('low', 'high', 'top')"]
    assert upward_arrows(g, ("low", "high", "stray", "top"), root="pkg") == bad[:1]
    pg = part_graph(g, root="pkg")
    assert pg["low"] == {"high"} and pg["high"] == {"low"} and pg["top"] == {"high"}
    (comp,) = strongly_connected(pg)
    assert comp == {"low", "high"}


def test_orchestrator_upward_import_crossing_and_unlisted_part_are_named(tmp_path: Path):
    _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/common/__init__.py": "",
        "pkg/common/a.py": "def f():\n    from ..plan import b\n",
        "pkg/plan/__init__.py": "",
        "pkg/plan/b.py": "from ..common import a\nimport trainer.x\n",
        "pkg/sup/__init__.py": "from .pol import c\n",
        "pkg/sup/pol/__init__.py": "",
        "pkg/sup/pol/c.py": "from ...plan import b\nfrom .. import d\n",
        "pkg/sup/d.py": "from ..common import a\n",
        "pkg/stray.py": "",
        "trainer/__init__.py": "",
        "trainer/x.py": "",
    })
    g = import_graph(tmp_path, ("pkg", "trainer"))
    order = ("common", "plan", "sup.pol", "sup")
    sides = {"common": "shared", "plan": "laptop", "sup.pol": "container", "sup": "container"}
    assert orchestrator_part("pkg.sup.pol.c", order, "pkg") == "sup.pol"
    assert orchestrator_part("pkg.sup.d", order, "pkg") == "sup"
    assert orchestrator_upward(g, order, "pkg") == [
        "pkg.common.a -> pkg.plan.b  (common imports plan, which is above it)",
        "pkg.stray: part 'stray' is not in the order ('common', 'plan', 'sup.pol', 'sup')",
        "pkg.sup.pol.c -> pkg.sup.d  (sup.pol imports sup, which is above it)",
    ]
    assert process_crossings(g, sides, {}, order, "pkg") == [
        "pkg.common.a -> pkg.plan.b  (the shared part imports the laptop part)",
        "pkg.plan.b -> trainer.x  (the laptop part imports the trainer)",
        "pkg.sup.pol.c -> pkg.plan.b  (container imports laptop)",
    ]
    assert process_crossings(g, sides, {("pkg.sup.pol.c", "pkg.plan.b"): "why"}, order, "pkg") == [
        "pkg.common.a -> pkg.plan.b  (the shared part imports the laptop part)",
        "pkg.plan.b -> trainer.x  (the laptop part imports the trainer)",
    ]
    pg = orchestrator_part_graph(g, order, "pkg")
    assert pg["common"] == {"plan"} and pg["plan"] == {"common"}
    assert sorted(map(sorted, strongly_connected(pg))) == [["common", "plan"], ["sup", "sup.pol"]]
