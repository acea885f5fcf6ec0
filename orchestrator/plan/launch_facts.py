"""What ``dfo launch`` learns about the host before it starts anything, in ONE round trip
(``scripts/launch_facts.sh``), and the record that lets it skip the env probe (pure).

The one command answers, in ``@section`` blocks: the launch probe (init system, env present,
run.lock held and by whom), which of the config's paths are missing, what the deployed env's
python reads (``orchestrator.remote.launch_facts``: the env fingerprint, the trainer source
hash and the target's ``config.json`` hash (the cache key's inputs), the live cache names,
the checkpoints by manifest, your own trainer's resume glob) and, for the env check, the
env's stamp, its recorded verification, deploy's state probe and the env probe itself when
the record does not hold; with ``model.init_from``, that directory's config.json
(``plan.init_from``: the trainer's settings from it). A :class:`FactsRequest` says what to ask;
:func:`resolve_resume` finds the checkpoint a ``--resume`` names in the answer's listing.

The env probe imports torch (and on a GPU host compiles a flex_attention smoke test): 5-35 s.
Its answer only changes when the env or the host's GPUs change, so a passed verification
is recorded in ``<env>/.dfo-verified`` with the env's *stamp*: a hash of what the probe's
answer and ``uv pip freeze`` depend on that a shell reads without Python (the env's real
path, the interpreter, ``pyvenv.cfg``, ``fingerprint.json``, ``.dfo-complete``, every name
under site-packages but ``__pycache__``, every ``*.dist-info`` entry's size/mtime/inode,
``*.pth`` files, the NVIDIA driver and GPU list). The record holds while the stamp is the
same **and** no file under site-packages (but ``__pycache__``) has a ctime after the time
the stamp was taken; otherwise the probe runs again in the same round trip, exactly as
``dfo deploy --check`` does, and launch records the new answer (with the files it writes)
only when everything passed. Record format: line 1 ``STAMP AT``, line 2 JSON
``{"probe": {...}, "freeze": "...", "verified": ISO}``.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Sequence

from dfo_contract.checkpoints import CkptInfo
from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.errors import ContractError
from dfo_contract.replies import EnvFacts, LaunchProbeReply, PartError
from dfo_contract.runspec import ResumeChoice

from ..common.errors import NotFoundError
from .cache_key import source_hash
from .deploy_plan import STATE_SCRIPT, RemoteState, parse_state
from .fingerprint import PROBE_SCRIPT
from .init_from import INIT_FROM_SCRIPT
from .probes import LAUNCH_PROBE_SCRIPT, parse_launch_probe
from .scripts import script_text

LAUNCH_FACTS_SCRIPT = script_text("launch_facts.sh")
#: in the deployed env's directory (beside fingerprint.json)
VERIFIED_FILE = ".dfo-verified"
#: the answer line of orchestrator.remote.launch_facts
FACTS_MARK = "@dfo-facts "


@dataclass
class VerifiedRecord:
    stamp: str
    at: str
    probe: EnvFingerprint
    freeze: str


@dataclass(frozen=True, kw_only=True)
class FactsRequest:
    """What launch asks the host (each value travels as an argv element)."""
    root: str
    run_lock: str
    check: bool = False                 # the env check's sections (deploy --check's facts)
    env_dir: str = ""                   # the env the lock wants (for the state probe)
    python_spec: str = ""
    wheel: str = ""
    paths: Sequence[str] = ()           # must exist on the host (the config's paths)
    commands: Sequence[str] = ()        # must run on the host (your own trainer's argv[0])
    #: must exist on the host too: your own trainer's ``cwd:`` (as ``DIR/.``) and the
    #: script its interpreter runs
    own_paths: Sequence[str] = ()
    ckpt_dirs: Sequence[str] = ()       # checkpoint dirs, listed by manifest
    fingerprint: str = ""               # the env's fingerprint.json
    source: bool = False                # the trainer's source hash (a cache-key input)
    hashes: Sequence[str] = ()          # files to sha256 (the target's config.json)
    glob: str | None = None             # your own trainer's resume glob
    caches: str = ""                    # the cache root: which keys have a live cache
    promote: bool = True                # False: promote no checkpoint (a dry run)
    init_from: str = ""                 # model.init_from: that directory's config.json


@dataclass
class LaunchFacts:
    launch: LaunchProbeReply = field(default_factory=LaunchProbeReply)   # the launch probe
    missing: list[str] = field(default_factory=list)        # config paths that do not exist
    #: commands that are not an executable file (a path) or not found on PATH (a name)
    missing_commands: list[str] = field(default_factory=list)
    py: EnvFacts | None = None      # orchestrator.remote.launch_facts (None: no answer)
    py_error: str = ""          # what it printed instead of its answer (an older env?)
    checked: bool = False                                   # the env sections were asked for
    stamp: str = ""
    at: str = ""
    holds: bool = False          # the script found the record's stamp current and no change
    changed: str = ""            # the first directory that changed since the record, if any
    verified: VerifiedRecord | None = None   # the record, only while it holds
    state: RemoteState | None = None
    probe_text: str | None = None            # the env probe's output (the record did not hold)
    complete: bool = False       # the script ran to its end
    #: the init_from script's answer (``plan.init_from.parse_reply``); None: not asked
    init_from: str | None = None
    #: set by the env check: the verification record a launch writes (path, bytes)
    record: tuple[str, bytes] | None = None

    @property
    def answered(self) -> bool:
        """The deployed env's python gave its facts (else ``py_error`` says what it printed)."""
        return self.py is not None

    @property
    def fingerprint(self) -> EnvFingerprint | None:
        """The env's fingerprint.json (None: absent, or it does not read)."""
        fp = self.py.fingerprint if self.py else None
        return fp if isinstance(fp, EnvFingerprint) else None

    @property
    def source_hash(self) -> str | None:
        src = self.py.source if self.py else None
        return source_hash(src) if isinstance(src, dict) and src else None

    def file_hash(self, path: str) -> str | None:
        h = self.py.hashes.get(path) if self.py else None
        return h if isinstance(h, str) else None

    @property
    def caches(self) -> frozenset[str]:
        c = self.py.caches if self.py else None
        return frozenset(c) if isinstance(c, list) else frozenset()

    def glob_matches(self) -> list[tuple[str, float]]:
        """Your own trainer's resume glob's matches (path, mtime); none when it failed."""
        g = self.py.glob if self.py else None
        return list(g) if isinstance(g, list) else []

    def unanswered(self) -> str:
        return self.py_error or "the deployed env's python did not answer"


def facts_argv(req: FactsRequest) -> list[str]:
    """``bash -c SCRIPT NAME ARGS...``: every value is a positional parameter."""
    py: list[str] = []
    if req.fingerprint:
        py += ["--fingerprint", req.fingerprint]
    if req.source:
        py.append("--source")
    for h in req.hashes:
        py += ["--hash", h]
    for d in req.ckpt_dirs:
        py += ["--ckpt", d]
    if not req.promote:
        py.append("--no-promote")
    if req.glob is not None:
        py += ["--glob", req.glob]
    if req.caches:
        py += ["--caches", req.caches]
    return ["bash", "-c", LAUNCH_FACTS_SCRIPT, "dfo-launch-facts", LAUNCH_PROBE_SCRIPT,
            STATE_SCRIPT, PROBE_SCRIPT if req.check else "", req.root, req.run_lock,
            req.env_dir, req.python_spec, req.wheel, "check" if req.check else "nocheck",
            INIT_FROM_SCRIPT if req.init_from else "", req.init_from,
            str(len(req.paths) + len(req.own_paths)), *req.paths, *req.own_paths,
            str(len(req.commands)), *req.commands, *py]


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
                    missing_commands=[c for c in s.get("commands", []) if c],
                    complete="end" in s)
    if "facts" in s:
        f.py, f.py_error = _py_facts(s["facts"])
    if "init_from" in s:
        f.init_from = "\n".join(s["init_from"])
    if "stamp" in s:
        f.checked = True
        kv = dict(ln.split("\t", 1) for ln in s["stamp"] if "\t" in ln)
        f.stamp, f.at = kv.get("stamp", ""), kv.get("at", "")
        f.holds = kv.get("holds") == "1"
        f.changed = kv.get("changed", "")
    if "state" in s:
        f.state = parse_state("\n".join(s["state"]))
    if "probe" in s:
        f.probe_text = "\n".join(s["probe"])
    if f.holds and f.stamp:
        f.verified = parse_record(f"{f.stamp} {f.at}\n" + "\n".join(s.get("verified", [])),
                                  stamp=f.stamp)
    return f


def _py_facts(lines: Sequence[str]) -> tuple[EnvFacts | None, str]:
    for ln in reversed(lines):
        if ln.startswith(FACTS_MARK):
            try:
                return EnvFacts.from_json(json.loads(ln[len(FACTS_MARK):])), ""
            except ContractError as e:
                return None, str(e)
            except ValueError:
                break
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
    return None, last


def checkpoint_listing(facts: LaunchFacts, ckpt_dir: str) -> list[CkptInfo]:
    """The checkpoints of ``ckpt_dir`` by manifest (oldest first); ValueError with the
    host's reason when they could not be listed."""
    if facts.py is None:
        raise ValueError(facts.unanswered())
    got = facts.py.checkpoints.get(ckpt_dir)
    if got is None:
        raise ValueError(f"{ckpt_dir} was not listed")
    if isinstance(got, PartError):
        raise ValueError(got.error)
    return sorted(got, key=lambda c: c.step)


# --- what a --resume names in the listing -----------------------------------------------

def skipped_by_latest(listing: Sequence[CkptInfo]) -> list[CkptInfo]:
    """The torn/incomplete checkpoints newer than the newest valid one: what ``--resume
    latest`` passes over (each is named in a warning)."""
    valid = [c.step for c in listing if c.valid]
    floor = max(valid) if valid else -1
    return [c for c in listing if not c.valid and c.step > floor]


def skipped_warning(c: CkptInfo) -> str:
    return (f"--resume latest: skipping checkpoint {c.name} "
            f"({c.reason or 'incomplete or torn: its manifest does not verify'})")


def _valid_names(listing: Sequence[CkptInfo]) -> str:
    return ", ".join(c.name for c in listing if c.valid) or "none"


def resolve_resume(resume: ResumeChoice, listing: Sequence[CkptInfo], ckpt_dir: str) -> str:
    """The checkpoint path a ``--resume`` names in ``listing`` (the checkpoints of
    ``ckpt_dir``; for a path, of its parent); NotFoundError lists the valid ones."""
    valid = [c for c in listing if c.valid]
    have = _valid_names(listing)
    if resume.kind == "latest":
        if not valid:
            raise NotFoundError(f"--resume latest: no valid checkpoint in {ckpt_dir}",
                                hint="launch without --resume to start from scratch")
        return valid[-1].path or posixpath.join(ckpt_dir, valid[-1].name)
    name = posixpath.basename(resume.value.rstrip("/"))
    for c in listing:
        if c.name == name or (resume.kind == "path" and c.path.rstrip("/") == resume.value):
            if c.valid:
                return resume.value if resume.kind == "path" else \
                    (c.path or posixpath.join(ckpt_dir, c.name))
            raise NotFoundError(f"--resume {resume.value}: checkpoint is incomplete or corrupt"
                                f" ({c.reason or 'manifest does not verify'})",
                                hint=f"valid checkpoints in {ckpt_dir}: {have}")
    if resume.kind == "path":
        raise NotFoundError(f"--resume {resume.value}: not a checkpoint",
                            hint=f"valid in that dir: {have}")
    raise NotFoundError(f"--resume {resume.value}: no such checkpoint in {ckpt_dir}",
                        hint=f"valid checkpoints: {have}")


# --- the env check's record ----------------------------------------------------------------

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
    try:
        probe = EnvFingerprint.from_json(d["probe"], what="the recorded env probe")
    except ContractError:
        return None
    return VerifiedRecord(stamp=stamp, at=parts[1], probe=probe, freeze=d["freeze"])


def record_bytes(stamp: str, at: str, probe: EnvFingerprint, freeze: str,
                 verified: str) -> bytes:
    if not stamp or not at or any(c.isspace() for c in stamp + at):
        raise ValueError("a verification record needs the stamp and its time")
    body = json.dumps({"probe": probe.to_json(), "freeze": freeze, "verified": verified},
                      sort_keys=True)
    return f"{stamp} {at}\n{body}\n".encode()
