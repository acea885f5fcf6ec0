"""Chat records -> ``Conversation``: OpenAI ``messages`` and ShareGPT ``conversations``, normalized
to what chat templates (Qwen3's in particular) render, so no turn is ever dropped silently.

- Roles: ``system``, ``user``, ``assistant``, ``tool``. OpenAI's ``developer`` is read as
  ``system`` and its legacy ``function`` as ``tool``; any other role is a bad record (Qwen3's
  template would render nothing for it and the turn would vanish from the sample).
- Content: a string; a list of content parts has its text parts joined with ``"\\n"`` (as
  vLLM joins them when serving); a non-text part is a bad record. ``null`` content is ``""``
  on an assistant turn (Qwen3's template fails on ``None``), a bad record elsewhere.
- ShareGPT: ``human``/``user``, ``gpt``/``assistant`` (and other assistants' names),
  ``system``, ``tool``/``observation``/``function_response``. A ``function_call`` turn (its
  value the JSON ``{"name": ..., "arguments": ...}``) becomes ``tool_calls`` of an assistant
  turn, merged into the assistant turn right before it, so the template renders
  ``<tool_call>`` tags.

A record that cannot be read raises ``BadRecord``: ``reason`` is the short kind (what drops are
counted by), ``str()`` the full message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")
OPENAI_ALIASES = {"developer": "system", "function": "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool",
                  "function_response": "tool"}
FUNCTION_CALL = "function_call"


class BadRecord(Exception):
    """A record that is not a conversation this reader understands."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


@dataclass(frozen=True)
class Conversation:
    messages: list[dict]
    tools: list | None = None


def conversation_from_record(obj: dict) -> Conversation:
    """OpenAI ``messages`` or ShareGPT ``conversations`` (from/value) -> a Conversation."""
    tools = obj.get("tools")
    if isinstance(tools, str):  # ShareGPT tool datasets often carry the schemas as a JSON string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise BadRecord("tools is not JSON", f"tools: not JSON ({e})") from None
    if tools is not None and not isinstance(tools, list):
        raise BadRecord("tools is not a list", "tools must be a list of tool schemas")
    if "messages" in obj:
        return Conversation(_openai(obj["messages"]), tools or None)
    if "conversations" in obj:
        return Conversation(_sharegpt(obj["conversations"]), tools or None)
    raise BadRecord("missing messages", "missing field 'messages' (chat lines need messages or "
                    "conversations; tokenized lines need input_ids and loss_mask)")


def _openai(msgs) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise BadRecord("messages is not a list", "messages must be a non-empty list of "
                        "{\"role\": str, \"content\": str} objects")
    out = []
    for j, m in enumerate(msgs):
        where = f"messages[{j}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRecord("message without a role", f"{where} must be an object with a string role")
        role = OPENAI_ALIASES.get(m["role"], m["role"])
        if role not in ROLES:
            raise BadRecord(f"unknown role {m['role']!r}", f"{where}.role = {m['role']!r}; expected "
                            "system, user, assistant or tool (developer is read as system, "
                            "function as tool)")
        msg = {k: v for k, v in m.items() if k not in ("role", "content")}
        msg["role"] = role
        msg["content"] = _content(m.get("content"), role, where, bool(m.get("tool_calls")))
        if "tool_calls" in msg:
            msg["tool_calls"] = _tool_calls(msg["tool_calls"], where)
            if not msg["tool_calls"]:
                del msg["tool_calls"]
        rc = msg.get("reasoning_content")
        if rc is not None and not isinstance(rc, str):
            raise BadRecord("reasoning_content is not a string", f"{where}.reasoning_content must "
                            "be a string")
        out.append(msg)
    return out


def _content(c, role: str, where: str, has_calls: bool) -> str:
    if isinstance(c, str):
        return c
    if c is None:
        if role == "assistant":
            return ""
        raise BadRecord(f"{role} content is null", f"{where}.content is null (only an assistant "
                        "turn may have no content)")
    if isinstance(c, list):
        texts = []
        for i, part in enumerate(c):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" \
                    and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRecord(f"content part of type {kind!r}", f"{where}.content[{i}] is of type "
                                f"{kind!r}; only text parts can be trained on")
        return "\n".join(texts)
    raise BadRecord("content is not text", f"{where}.content must be a string, a list of text "
                    f"parts or null, got {type(c).__name__}")


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise BadRecord("tool_calls is not a list", f"{where}.tool_calls must be a list")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRecord("tool call without a name", f"{where}.tool_calls[{i}] must be "
                            "{\"function\": {\"name\": str, \"arguments\": ...}}")
        args = fn.get("arguments", {})
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _sharegpt(conv) -> list[dict]:
    if not isinstance(conv, list) or not conv:
        raise BadRecord("conversations is not a list", "conversations must be a non-empty list "
                        "of {\"from\": ..., \"value\": ...}")
    out: list[dict] = []
    for j, turn in enumerate(conv):
        where = f"conversations[{j}]"
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise BadRecord("turn without a string value", f"{where} must be {{\"from\": str, "
                            "\"value\": str}")
        src = str(turn.get("from", "")).lower()
        if src == FUNCTION_CALL:
            call = _function_call(turn["value"], where)
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            continue
        role = SHAREGPT_ROLES.get(src)
        if role is None:
            raise BadRecord(f"unknown ShareGPT from {turn.get('from')!r}",
                            f"{where}.from = {turn.get('from')!r}; expected human, gpt, system, "
                            "tool, observation, function_call or function_response")
        out.append({"role": role, "content": turn["value"]})
    return out


def _function_call(value: str, where: str) -> dict:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise BadRecord("function_call is not JSON", f"{where}.value: a function_call must be "
                        f"JSON {{\"name\": ..., \"arguments\": ...}} ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise BadRecord("function_call without a name", f"{where}.value: a function_call must be "
                        "JSON {\"name\": ..., \"arguments\": ...}")
    return {"type": "function", "function": {"name": obj["name"], "arguments": obj.get("arguments", {})}}
