"""What ``regenerate`` records about how it generated (``OUT.meta.json`` beside its output),
and the check ``tokenize`` makes against it.

The thinking mode matters to the masks: data generated with ``--thinking off`` has replies
written after the empty think block of the generation prompt, and should be tokenized with
``--no-thinking`` (that block is then prompt, not loss); data generated with thinking on should
be tokenized without it. ``tokenize`` warns in one line when an input's metadata disagrees.

It also records the sampling parameters (greedy unless given; resuming with others is a data
error: the file would mix two distributions) and every engine that wrote lines to the output
(name, version, the server's host and model; never a key), in the order they first did.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace

from dfo_contract.exitcodes import DataError
from dfo_contract.fsio import atomic_write_text

FORMAT = "dfo-regenerated"
VERSION = 1
SUFFIX = ".meta.json"


@dataclass(frozen=True)
class RegenMeta:
    thinking: str          # "on" | "off": enable_thinking passed to the chat template
    target: str            # the target directory that generated the replies
    format: str = FORMAT
    version: int = VERSION
    sampling: dict | None = None   # trainer.data.engines.Sampling.record()
    engines: tuple = ()            # EngineInfo records (dicts) of the runs that wrote to it


def meta_path(out: str) -> str:
    return out + SUFFIX


def read_meta(data: str) -> RegenMeta | None:
    """The metadata beside ``data``; None when there is none or it is not ours."""
    p = meta_path(data)
    try:
        with open(p) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION \
            or raw.get("thinking") not in ("on", "off"):
        return None
    sampling = raw.get("sampling") if isinstance(raw.get("sampling"), dict) else None
    engines = tuple(e for e in raw.get("engines") or () if isinstance(e, dict)) \
        if isinstance(raw.get("engines"), list) else ()
    return RegenMeta(thinking=raw["thinking"], target=str(raw.get("target", "")), sampling=sampling,
                     engines=engines)


def write_meta(out: str, meta: RegenMeta) -> None:
    """Record ``meta`` for ``out``; an output generated in the other thinking mode or with other
    sampling parameters is an error (resuming it would mix the two). The engines already
    recorded for a non-empty output are kept, ``meta``'s appended when new."""
    old = read_meta(out)
    started = os.path.exists(out) and os.path.getsize(out) > 0
    if old is not None and started:
        if old.thinking != meta.thinking:
            raise DataError(f"--thinking {meta.thinking}: {out} was generated with --thinking "
                            f"{old.thinking}; use that, or a new --out")
        if old.sampling is not None and meta.sampling is not None and old.sampling != meta.sampling:
            raise DataError(f"sampling {_sampling_flags(meta.sampling)}: {out} was generated with "
                            f"{_sampling_flags(old.sampling)}; use those, or a new --out")
        engines = list(old.engines) + [e for e in meta.engines if e not in old.engines]
        meta = replace(meta, engines=tuple(engines))
    atomic_write_text(meta_path(out), json.dumps(asdict(meta), indent=1) + "\n")


def _sampling_flags(s: dict) -> str:
    flags = [f"--temperature {s.get('temperature')}", f"--top-p {s.get('top_p')}",
             f"--max-new-tokens {s.get('max_new_tokens')}"]
    if s.get("seed") is not None:
        flags.append(f"--seed {s['seed']}")
    return " ".join(flags)


def thinking_warnings(inputs: list[str], no_thinking: bool) -> list[str]:
    """One line per input whose recorded thinking mode disagrees with ``--no-thinking``."""
    out = []
    for p in inputs:
        m = read_meta(p)
        if m is None:
            continue
        if m.thinking == "off" and not no_thinking:
            out.append(f"tokenize: warning: {p} was generated with --thinking off; pass "
                       "--no-thinking so the empty think block is prompt, as when it was generated")
        elif m.thinking == "on" and no_thinking:
            out.append(f"tokenize: warning: {p} was generated with --thinking on; drop "
                       "--no-thinking so the masks match how it was generated")
    return out
