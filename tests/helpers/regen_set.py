"""The fixed set of chat records the regenerate engines are compared on (tests and bench):
multi-turn, ShareGPT, a system prompt, tool calls kept, a reply with reasoning, a record
longer than ``LIMIT`` tokens of context, a malformed JSON line and a record that is not a
conversation."""

from __future__ import annotations

import json

#: the context the comparisons run with (``--max-model-len``): the long record exceeds it
LIMIT = 320
NEW = 12   # --max-new-tokens

#: in the form vLLM's server normalizes a tool to (name, description, parameters): a schema
#: without a description, or with its keys in another order, reaches vLLM's template as
#: ``"description": null`` and in that order (docs/trainer.md, Engines)
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "the weather in a city",
                                           "parameters": {"type": "object"}}}]


def fixed_lines() -> list[str]:
    """Lines of a JSONL file: 8 conversations, 2 malformed, one too long (7 written)."""
    call = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    recs: list = [
        {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "one more"}, {"role": "assistant", "content": "c"}]},
        {"conversations": [{"from": "human", "value": "sharegpt"}, {"from": "gpt", "value": "x"}]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}]},
        {"messages": [{"role": "user", "content": "Oslo weather?"},
                      {"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "content": "sunny, 20C"},
                      {"role": "assistant", "content": "It is sunny."}], "tools": TOOLS},
        "MALFORMED",
        {"messages": [{"role": "user", "content": "long " * 80}, {"role": "assistant", "content": "y"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"},
                      {"role": "user", "content": "q2"}, {"role": "assistant", "content": "r2"}]},
        {"not": "a conversation"},
        {"messages": [{"role": "user", "content": "last"}, {"role": "assistant", "content": "z"}]},
        {"messages": [{"role": "user", "content": "tools, no call"}, {"role": "assistant", "content": "k"}],
         "tools": TOOLS},
    ]
    return ['{"messages": [' + "\n" if r == "MALFORMED" else json.dumps(r) + "\n" for r in recs]


def write_fixed(path, copies: int = 1) -> str:
    with open(path, "w") as f:
        f.write("".join(fixed_lines() * copies))
    return str(path)
