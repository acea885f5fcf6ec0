"""``model.init_from`` on this side (pure): the drafter directory's config.json read on the
host, and the run config the trainer runs from it.

The trainer takes settings from the directory named by ``model.init_from`` (block size,
drafter layers, taps, mask token, the layers' attention, DFlash2's fields:
``dfo_contract.trainer_config.drafter_dir``). ``dfo launch`` and ``dfo warm-cache`` read the
directory's config.json on the host with :func:`init_from_probe` (``launch`` inside its one
pre-launch round trip: ``scripts/launch_facts.sh`` runs the same script) and validate the
run and compute its compile-cache key (``cache_key.config_key``) from :func:`effective`, on
the typed ``TrainerConfig``: the same function the trainer applies, so a drafter of another
block size, layer count or attention pattern gives another key. A directory that is missing, holds no readable config.json, or a drafter the
trainer would refuse is one ``ConfigError`` line (exit 2) naming the path and the fix.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from dfo_contract import trainer_config as tcfg
from dfo_contract.exitcodes import TrainerError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_config.drafter_dir import check_files, drafter_json

from ..common.errors import ConfigError
from .probes import Probe, text
from .scripts import script_text

INIT_FROM_SCRIPT = script_text("init_from.sh")
KEY = "model.init_from"


@dataclass(frozen=True)
class DrafterReply:
    """What the host said of the drafter directory ``path``."""
    path: str
    state: str              # ok | nodir | noconfig | unreadable | none (no answer)
    text: str = ""          # config.json's text (ok); why it is unreadable (unreadable)
    files: tuple[str, ...] = ()   # the names of the directory's entries


def init_from_probe(path: str) -> Probe[DrafterReply]:
    return Probe("init-from", ("sh", "-c", INIT_FROM_SCRIPT, "dfo-init-from", path),
                 lambda out: parse_reply(path, text(out.stdout)))


def parse_reply(path: str, output: str) -> DrafterReply:
    """The script's line (the last that is one of its answers), with the ``file`` lines."""
    lines = output.splitlines()
    files = tuple(ln[len("file "):] for ln in lines if ln.startswith("file "))
    for ln in reversed(lines):
        state, _, rest = ln.strip().partition(" ")
        if state in ("nodir", "noconfig"):
            return DrafterReply(path, state, files=files)
        if state == "unreadable":
            return DrafterReply(path, state, rest.strip() or "unreadable", files=files)
        if state == "ok":
            try:
                return DrafterReply(path, state,
                                    base64.b64decode(rest, validate=True).decode("utf-8"),
                                    files=files)
            except (binascii.Error, ValueError):   # UnicodeDecodeError is a ValueError
                return DrafterReply(path, "unreadable", "not UTF-8 text", files=files)
    return DrafterReply(path, "none")


def effective(cfg: TrainerConfig, reply: DrafterReply | None, *, host: str,
              config: str | None) -> TrainerConfig:
    """``cfg`` (a validated run config; its ``explicit_keys``: the keys the file or ``--set``
    gave) as the trainer runs it: a copy with the settings of the drafter directory
    ``model.init_from`` names (``reply``: what the host said of it), validated again; ``cfg``
    itself without init_from. ``config``: the run config file (None: the default, the demo's)."""
    path = cfg.model.init_from or ""
    if not path:
        return cfg
    where = config or "the default config (the demo's)"
    fix = f"fix {KEY} in {config} or pass --set {KEY}=DIR" if config else \
        f"pass --config with {KEY}, or --set {KEY}=DIR"
    if reply is None or reply.path != path or reply.state == "none":
        raise ConfigError(f"{KEY} of {where}: {host} gave no answer for {path}",
                          hint="try again; the host needs sh and coreutils (base64)")
    if reply.state == "nodir":
        raise ConfigError(f"{KEY} of {where}: {path} does not exist on {host}", hint=fix)
    try:
        conf = drafter_json(None if reply.state == "noconfig" else reply.text, path,
                            unreadable=reply.text if reply.state == "unreadable" else "")
        out = tcfg.effective_config(tcfg.copied(cfg), conf)
        check_files(reply.files, path)
        return out
    except TrainerError as e:   # the trainer's own refusal, as dfo's (exit 2, one line)
        line = str(e).strip().splitlines()[0].removeprefix("config: ")
        raise ConfigError(f"{KEY} of {where} on {host}: {line}") from None
