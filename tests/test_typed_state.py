"""The records that cross a process are read by attribute: state.json's sub-records
(``dfo_contract.state_records``), the group verdict's parts, the events' evidence lines and
causes, the replies of ``dfo_contract.replies``, the compile cache's manifest and helper
replies (``dfo_contract.cache_records``) and the env fingerprint
(``dfo_contract.env_fingerprint``) are dataclasses, so mypy (tests/test_static_checks.py)
flags a ``.get("k")`` on one; this AST scan of orchestrator/ and dfo_contract/ also finds a
string-keyed read (``x["k"]``, ``x.get("k")``) of such a record where mypy cannot see the
type (an untyped function): on the attribute that holds it (``state.last_checkpoint["step"]``)
or on a name given that attribute in the same function (``ck = state.last_checkpoint``)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("orchestrator", "dfo_contract")
#: attributes that hold a typed record (RunState's, GroupVerdict's, LaunchFacts', the events'
#: ``evidence`` and ``cause``, a snapshot manifest's parts, ...)
RECORD_ATTRS = {"last_checkpoint", "fallbacks", "throughput_low", "budget", "launch",
                "exit_info", "fallback", "restart", "records", "evidence", "cause",
                "provenance", "adopted", "warmup", "sizes", "tar", "snapshots", "live",
                "fingerprint", "current_fingerprint"}
#: where reading a record's raw JSON by key is the decoding itself
DECODERS = {"dfo_contract/codec.py"}


def _key(call_or_sub: ast.AST) -> tuple[ast.AST, str] | None:
    """(the base, the constant key) of ``base["k"]`` or ``base.get("k", ...)``."""
    n = call_or_sub
    if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) \
            and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
        return n.value, n.slice.value
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
            and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
        return n.func.value, n.args[0].value
    return None


def _holds_record(e: ast.AST) -> bool:
    """``x.last_checkpoint``, ``(x.last_checkpoint or {})``, ``x.fallbacks[i]``, ..."""
    if isinstance(e, ast.BoolOp):
        return any(_holds_record(v) for v in e.values)
    if isinstance(e, ast.IfExp):
        return _holds_record(e.body) or _holds_record(e.orelse)
    if isinstance(e, ast.Subscript) and not isinstance(e.slice, ast.Constant):
        return _holds_record(e.value)
    return isinstance(e, ast.Attribute) and e.attr in RECORD_ATTRS


def violations(src: str, rel: str) -> list[str]:
    out: list[str] = []
    tree = ast.parse(src)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *scopes]:
        names: set[str] = set()
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and _holds_record(n.value):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif isinstance(n, ast.For) and _holds_record(n.iter) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
            elif isinstance(n, ast.comprehension) and _holds_record(n.iter) \
                    and isinstance(n.target, ast.Name):
                names.add(n.target.id)
        for n in ast.walk(scope):
            got = _key(n)
            if got is None:
                continue
            base, key = got
            if _holds_record(base) or (isinstance(base, ast.Name) and base.id in names):
                out.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
    return sorted(set(out))


def scan(root: Path) -> list[str]:
    out: list[str] = []
    for pkg in SCANNED:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if rel not in DECODERS:
                out += violations(p.read_text(), rel)
    return out


def test_no_typed_record_is_read_by_string_key():
    found = scan(REPO)
    assert not found, "read these by attribute:\n" + "\n".join(found)


def test_the_scan_finds_string_keyed_reads_of_records():
    src = textwrap.dedent('''
        def show(s, facts, reply, tb):
            ck = s.last_checkpoint or {}
            fb = ", ".join(str(f.get("step")) for f in s.fallbacks)
            if facts.launch.get("lock") == "held":
                pass
            low = s.throughput_low
            return ck["step"], low.get("cause"), s.budget["total"], tb.exit_info["exit"]

        def snapshot(m, raw, key):
            prov = m.provenance or {}
            w = m.warmup
            for snap in raw.snapshots.values():
                pass
            return (prov.get("host"), w["cold_s"], m.sizes["total"], m.tar["size"],
                    (m.adopted or {}).get("how"), raw.live[key].get("target"))

        def env(report, state):
            fp = state.current_fingerprint or {}
            return report.fingerprint.get("torch"), fp["profile"]
    ''')
    got = [v.split(": ", 1)[1] for v in violations(src, "orchestrator/x.py")]
    assert sorted(got) == sorted(["f.get('step')", "facts.launch.get('lock')", "ck['step']",
                                  "low.get('cause')", "s.budget['total']",
                                  "tb.exit_info['exit']", "prov.get('host')", "w['cold_s']",
                                  "m.sizes['total']", "m.tar['size']",
                                  "(m.adopted or {}).get('how')",
                                  "raw.live[key].get('target')",
                                  "report.fingerprint.get('torch')", "fp['profile']"]), got


def test_the_scan_leaves_attribute_reads_and_other_dicts_alone():
    src = textwrap.dedent('''
        def show(s, facts, d):
            ck = s.last_checkpoint
            fb = ", ".join(str(f.step) for f in s.fallbacks)
            return ck.step if ck else None, facts.launch.held, d["step"], s.ladder_pos.get(c, 0)
    ''')
    assert violations(src, "orchestrator/x.py") == []
