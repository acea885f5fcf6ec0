"""The target's tokenizer, and the chat masker built on it (trainer.data.chat).

``load_tokenizer`` is the one place a target directory's tokenizer is loaded (transformers
is imported only then; ``Tokenizers`` keeps a process's, by directory); ``load_masker`` and ``tokenize_chat`` give one-line ``DataError``s.
"""

from __future__ import annotations

import json
import os

from dfo_contract.exitcodes import DataError

from .chat import ChatMasker, Unmaskable
from .records import Conversation


def tokenize_chat(tokenizer, messages: list[dict], where: str = "data") -> tuple[list[int], list[int]]:
    """Token ids and the generated-tokens loss mask of one conversation (trainer.data.chat)."""
    try:
        return ChatMasker(tokenizer).mask(Conversation(messages))
    except Unmaskable as e:
        raise DataError(f"{where}: cannot mask the conversation: {e}") from None


_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def load_tokenizer(path: str):
    """The tokenizer in a target directory, or None when it has none (loaded now; a process
    shares one through its ``Tokenizers``).

    The class ``tokenizer_config.json`` names is loaded directly when transformers has it
    (``AutoTokenizer``'s own choice: the ``...Fast`` variant first); that skips the import of
    the model configuration code, and of torch with it, which costs seconds per process.
    Anything else (no class named, remote code) goes through ``AutoTokenizer``."""
    if not _has_tokenizer(path):
        return None
    return _load(path)


class Tokenizers:
    """The tokenizers a process loaded, by directory (trainer.core.runtime.Runtime holds one).

    A large vocabulary takes seconds to load, and a training start asks for it for the mask
    token, the vocabulary length, the data and the held-out data: callers share one and only
    read it. A file of the directory changed on disk (name, size or mtime; weights aside)
    loads it anew."""

    def __init__(self):
        #: {(realpath, the directory's file signature): tokenizer}
        self._loaded: dict[tuple, object] = {}

    def load(self, path: str):
        """``load_tokenizer(path)``, once per directory and signature."""
        if not _has_tokenizer(path):
            return None
        key = _signature(path)
        tok = self._loaded.get(key)
        if tok is None:
            tok = self._loaded[key] = _load(path)
        return tok


def tokenizer_loader(tokenizers: Tokenizers | None):
    """``tokenizers.load`` (a process's, shared), or ``load_tokenizer`` (loaded on each call)
    without one."""
    return tokenizers.load if tokenizers is not None else load_tokenizer


def _has_tokenizer(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


def _signature(path: str) -> tuple:
    real = os.path.realpath(path)
    files = []
    with os.scandir(real) as it:
        for e in it:
            if e.is_file() and not e.name.endswith(_WEIGHTS):
                st = e.stat()
                files.append((e.name, st.st_size, st.st_mtime_ns))
    return real, tuple(sorted(files))


def _load(path: str):
    cls = _named_class(path)
    if cls is not None:
        return cls.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _named_class(path: str):
    """The tokenizer class named in ``tokenizer_config.json``, or None."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    name = cfg.get("tokenizer_class") if isinstance(cfg, dict) else None
    if not isinstance(name, str) or not name.isidentifier() or "auto_map" in cfg:
        return None
    import transformers

    for cand in ([name] if name.endswith("Fast") else [name + "Fast", name]):
        try:
            cls = getattr(transformers, cand)
        except (AttributeError, ImportError):
            continue
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase):
            return cls
    return None


def load_masker(target: str, template_kwargs: dict | None = None) -> ChatMasker | None:
    """A ChatMasker for the target's tokenizer; None when the target has no tokenizer."""
    tok = load_tokenizer(target)
    if tok is None:
        return None
    try:
        return ChatMasker(tok, template_kwargs=template_kwargs)
    except Unmaskable as e:
        raise DataError(f"data: {target}: chat data cannot be masked: {e}") from None
