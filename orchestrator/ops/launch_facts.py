"""What ``dfo launch`` learns about the host before it starts anything, in ONE round trip
(``scripts/launch_facts.sh``), and the record that lets it skip the env probe (pure).

The env probe imports torch (and on a GPU host compiles a flex_attention smoke test): 5-35 s.
Its answer only changes when the env or the host's GPUs change, so a passed verification
is recorded in ``<env>/.dfo-verified`` with the env's *stamp*: a hash of what the probe's
answer and ``uv pip freeze`` depend on that a shell reads without Python (the env's real
path, the interpreter, ``pyvenv.cfg``, ``fingerprint.json``, ``.dfo-complete``, every name
under site-packages but ``__pycache__``, every ``*.dist-info`` entry's size/mtime/inode,
``*.pth`` files, the NVIDIA driver and GPU list). The record holds while the stamp is the
same **and** no file under site-packages (but ``__pycache__``) has a ctime after the time
the stamp was taken; otherwise launch
probes again, exactly as ``dfo deploy --check`` does, and records the new answer only when
everything passed. Record format: line 1 ``STAMP AT``, line 2 JSON
``{"probe": {...}, "freeze": "...", "verified": ISO}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .deploy_plan import STATE_SCRIPT, RemoteState, parse_state
from .probes import LAUNCH_PROBE_SCRIPT, parse_launch_probe
from .scripts import script_text

LAUNCH_FACTS_SCRIPT = script_text("launch_facts.sh")
#: in the deployed env's directory (beside fingerprint.json)
VERIFIED_FILE = ".dfo-verified"


@dataclass
class VerifiedRecord:
    stamp: str
    at: str
    probe: dict[str, Any]
    freeze: str


@dataclass
class LaunchFacts:
    launch: dict[str, str] = field(default_factory=dict)   # the launch probe's key=value
    #: (and ``checkpoints=none`` when the run's checkpoint dir is absent or empty)
    missing: list[str] = field(default_factory=list)        # config paths that do not exist
    checked: bool = False                                   # the env sections were asked for
    stamp: str = ""
    at: str = ""
    holds: bool = False          # the script found the record's stamp current and no change
    changed: str = ""            # the first directory that changed since the record, if any
    verified: VerifiedRecord | None = None   # the record, only while it holds
    state: RemoteState | None = None
    complete: bool = False       # the script ran to its end


def facts_argv(root: str, run_lock: str, env_dir: str, python_spec: str, wheel: str, *,
               check: bool, paths: Sequence[str], checkpoint_dir: str = "") -> list[str]:
    """``bash -c SCRIPT NAME ARGS...``: every value is a positional parameter."""
    return ["bash", "-c", LAUNCH_FACTS_SCRIPT, "dfo-launch-facts", LAUNCH_PROBE_SCRIPT,
            STATE_SCRIPT, root, run_lock, env_dir, python_spec, wheel,
            "check" if check else "nocheck", checkpoint_dir, *paths]


def _sections(output: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for ln in output.splitlines():
        if ln.startswith("@section "):
            cur = out.setdefault(ln[len("@section "):].strip(), [])
        elif cur is not None:
            cur.append(ln)
    return out


def parse_facts(output: str) -> LaunchFacts:
    s = _sections(output)
    f = LaunchFacts(launch=parse_launch_probe("\n".join(s.get("launch", []))),
                    missing=[p for p in s.get("missing", []) if p],
                    complete="end" in s)
    if "stamp" in s:
        f.checked = True
        kv = dict(ln.split("\t", 1) for ln in s["stamp"] if "\t" in ln)
        f.stamp, f.at = kv.get("stamp", ""), kv.get("at", "")
        f.holds = kv.get("holds") == "1"
        f.changed = kv.get("changed", "")
    if "state" in s:
        f.state = parse_state("\n".join(s["state"]))
    if f.holds and f.stamp:
        f.verified = parse_record(f"{f.stamp} {f.at}\n" + "\n".join(s.get("verified", [])),
                                  stamp=f.stamp)
    return f


def parse_record(text: str, *, stamp: str) -> VerifiedRecord | None:
    """The record, or None when it is torn, of another stamp, or not what we wrote."""
    head, _, body = text.partition("\n")
    parts = head.split()
    if len(parts) != 2 or parts[0] != stamp:
        return None
    try:
        d = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(d, dict) and isinstance(d.get("probe"), dict)
            and isinstance(d.get("freeze"), str)):
        return None
    return VerifiedRecord(stamp=stamp, at=parts[1], probe=d["probe"], freeze=d["freeze"])


def record_bytes(stamp: str, at: str, probe: Mapping[str, Any], freeze: str,
                 verified: str) -> bytes:
    if not stamp or not at or any(c.isspace() for c in stamp + at):
        raise ValueError("a verification record needs the stamp and its time")
    body = json.dumps({"probe": dict(probe), "freeze": freeze, "verified": verified},
                      sort_keys=True)
    return f"{stamp} {at}\n{body}\n".encode()
