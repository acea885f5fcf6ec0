"""Qwen3's real chat templates and tokenizer (read from the shared fixtures, never copied here),
a tiny target directory that uses them, and thirteen chat records in the shapes Qwen3 data has.

The fixtures directory is ``$DFO_QWEN3_FIXTURES``, else the first ``shared/fixtures/qwen3``
found walking up from this repository (a worktree at ``/work/wt/BR`` finds ``/work/shared``).
Tests that need it skip, naming what is missing, when neither exists.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "DFO_QWEN3_FIXTURES"
TEMPLATES = ("hybrid", "thinking-2507", "hybrid-revised", "instruct-2507")
_FILES = {"hybrid": "qwen3-hybrid.jinja", "thinking-2507": "qwen3-thinking-2507.jinja",
          "hybrid-revised": "qwen3-hybrid-revised.reconstructed.jinja"}


def fixtures_dir() -> Path | None:
    env = os.environ.get(ENV)
    if env:
        return Path(env) if (Path(env) / "templates").is_dir() else None
    for parent in [REPO, *REPO.parents]:
        d = parent / "shared" / "fixtures" / "qwen3"
        if (d / "templates").is_dir() and (d / "tokenizer").is_dir():
            return d
    return None


def require_fixtures() -> Path:
    d = fixtures_dir()
    if d is None:
        pytest.skip(f"Qwen3 fixtures absent: set ${ENV} or place them at <an ancestor of "
                    f"{REPO}>/shared/fixtures/qwen3 (templates/, tokenizer/)")
    return d


def instruct_2507(thinking_2507: str) -> str:
    """An Instruct-2507-style template derived from the Thinking-2507 one by two edits: every
    assistant turn renders ``<|im_start|>assistant\\n`` + content (the branch that renders
    reasoning for turns after the last query is replaced), and the generation prompt is
    ``<|im_start|>assistant\\n`` (no ``<think>``)."""
    branch = re.compile(r"\{%- if loop\.index0 > ns\.last_query_index %\}.*?"
                        r"\{%- endif %\}\s*\{%- else %\}.*?\{%- endif %\}", re.S)
    out, n = branch.subn("{{- '<|im_start|>' + message.role + '\\\\n' + content }}", thinking_2507, 1)
    gen = "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    assert n == 1 and gen in out, "the Thinking-2507 template changed; update instruct_2507()"
    out = out.replace(gen, "{{- '<|im_start|>assistant\\n' }}")
    assert "<think>\\n" not in out.replace("'<think>'", "")
    return out


def template(name: str) -> str:
    d = require_fixtures() / "templates"
    if name == "instruct-2507":
        return instruct_2507((d / _FILES["thinking-2507"]).read_text())
    return (d / _FILES[name]).read_text()


def write_tokenizer(dest: Path, chat_template: str) -> Path:
    """tokenizer.json (gunzipped) and tokenizer_config.json carrying ``chat_template``."""
    src = require_fixtures() / "tokenizer"
    dest.mkdir(parents=True, exist_ok=True)
    with gzip.open(src / "tokenizer.json.gz", "rb") as f, open(dest / "tokenizer.json", "wb") as o:
        shutil.copyfileobj(f, o)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


def load_tokenizer(dest: Path, name: str):
    from transformers import AutoTokenizer

    if not (dest / "tokenizer.json").is_file():
        write_tokenizer(dest, template(name))
    return AutoTokenizer.from_pretrained(str(dest), local_files_only=True)


def make_target(dest: Path, name: str, *, weights: bool = False) -> str:
    """A target directory with Qwen3's vocab (151936) and tokenizer, and template ``name``.
    Without ``weights`` only config.json is written (enough for ``tokenize``)."""
    from trainer.model.target import make_tiny_target

    if weights:
        make_tiny_target(str(dest), hidden=32, layers=1, vocab=151936, heads=2, kv_heads=1,
                         head_dim=16, intermediate=64, tokenizer=False)
        cfg = json.loads((dest / "config.json").read_text())
        cfg.update(bos_token_id=151643, eos_token_id=151645)
        (dest / "config.json").write_text(json.dumps(cfg))
    else:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "config.json").write_text(json.dumps(
            {"model_type": "qwen3", "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645}))
    write_tokenizer(dest, template(name))
    return str(dest)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]


def _m(role, content, **kw):
    return {"role": role, "content": content, **kw}


def records() -> list[dict]:
    """Thirteen chat records (OpenAI and ShareGPT) in the shapes Qwen3 chat data has."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    return [
        {"messages": [_m("user", "What is 2+2?"), _m("assistant", "2+2 is 4.")]},
        {"messages": [_m("system", "You are terse."), _m("user", "Capital of France?"),
                      _m("assistant", "Paris.")]},
        {"messages": [_m("user", "Hi!"), _m("assistant", "Hello! How can I help?"),
                      _m("user", "Tell me a joke."), _m("assistant", "Why did the chicken cross the road?")]},
        {"messages": [_m("user", "Is 7 prime?"), _m("assistant", "Yes, 7 is prime.",
                                                     reasoning_content="7 has no divisors but 1 and 7."),
                      _m("user", "And 9?"), _m("assistant", "No: 9 = 3 x 3.",
                                               reasoning_content="9 is divisible by 3.")]},
        {"messages": [_m("user", "Spell cat backwards."),
                      _m("assistant", "<think>\nc-a-t reversed is t-a-c.\n</think>\n\ntac")]},
        {"messages": [_m("user", "Weather in Oslo?"), _m("assistant", None, tool_calls=[call]),
                      _m("tool", '{"temp": 21, "sky": "sunny"}'), _m("assistant", "Sunny and 21 C in Oslo.")],
         "tools": TOOLS},
        {"conversations": [{"from": "human", "value": "Name a color."}, {"from": "gpt", "value": "Blue."},
                           {"from": "human", "value": "Another?"}, {"from": "gpt", "value": "Green."},
                           {"from": "human", "value": "One more."}, {"from": "gpt", "value": "Red."}]},
        {"conversations": [{"from": "system", "value": "Answer in French."},
                           {"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Bonjour"}]},
        {"messages": [_m("user", "Print a blank line, then ok."), _m("assistant", "\nok"),
                      _m("user", "Now without it."), _m("assistant", "ok")]},
        {"messages": [_m("user", "Show the chat header Qwen uses."),
                      _m("assistant", "It is <|im_start|>assistant\n followed by the reply.")]},
        {"messages": [_m("user", "Check Oslo."), _m("assistant", "Let me look that up.", tool_calls=[call]),
                      _m("tool", '{"temp": 3}'), _m("assistant", "It is 3 C.")], "tools": TOOLS},
        {"messages": [_m("developer", "Always answer in one word."), _m("user", "Sky color?"),
                      _m("assistant", "Blue.")]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Sum 1 and 2"},
                                                   {"type": "text", "text": "please."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "3."}]}]},
    ]


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)
