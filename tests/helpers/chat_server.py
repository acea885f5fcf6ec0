"""An OpenAI-compatible chat server on 127.0.0.1 that runs a target through transformers:
the protocol stand-in for a user's vLLM or SGLang server (tests and bench only).

It serves ``GET /v1/models``, ``GET /version`` and ``POST /v1/chat/completions``: the messages
(and tools: each tool as vLLM's request schema dumps it, ``name``, ``description`` (null
when absent), ``parameters``; tool call arguments parsed from JSON strings into objects, as
vLLM does) are
rendered by the target's own chat template with ``chat_template_kwargs`` and the
generation prompt, generated one request at a time (greedy unless ``temperature`` > 0), stopped
at ``stop_token_ids`` or the tokenizer's eos, decoded without special tokens; ``usage`` counts
the generated tokens, the stop token included. ``Authorization`` is checked when a key is set.
What ``vllm serve`` without a tool parser refuses is refused here too (400): tools with
``tool_choice`` "auto" (its default), tool calls without an id or with arguments that are
not a JSON string.

    python -m tests.helpers.chat_server --target DIR [--port 0] [--key-env VAR]

prints ``listening http://127.0.0.1:PORT`` when it accepts requests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "standin-1"


class ChatModel:
    def __init__(self, target: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(target)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.name = os.path.basename(os.path.abspath(target))
        self.lock = threading.Lock()
        self.requests = 0
        #: with ``hold_after`` set, every request after that many waits for ``gate`` (a test
        #: holds a client mid-run); ``held`` counts the requests waiting
        self.hold_after: int | None = None
        self.gate = threading.Event()
        self.held = 0
        #: with ``fail_from`` set, ``fail_count`` requests after that many answer 500
        self.fail_from: int | None = None
        self.fail_count = 0
        self.failed = 0

    def complete(self, body: dict) -> dict | None:
        """The completion, or None for a failure the test asked for (a 500)."""
        with self.lock:
            if self.fail_from is not None and self.requests >= self.fail_from \
                    and self.failed < self.fail_count:
                self.failed += 1
                return None
        kw = body.get("chat_template_kwargs") or {}
        tools = body.get("tools")
        if tools:  # as vLLM's request schema dumps them
            tools = [{"type": t.get("type", "function"),
                      "function": {"name": t["function"]["name"],
                                   "description": t["function"].get("description"),
                                   "parameters": t["function"].get("parameters")}} for t in tools]
        for m in body["messages"]:  # as vLLM does: tool call arguments to objects for the template
            for c in m.get("tool_calls") or ():
                if isinstance(c["function"].get("arguments"), str):
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"] or "{}")
        text = self.tok.apply_chat_template(body["messages"], tools=tools, tokenize=False,
                                            add_generation_prompt=True, **kw)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        stops = list(body.get("stop_token_ids") or []) or [self.tok.eos_token_id]
        temp = float(body.get("temperature") or 0.0)
        sample = {"do_sample": True, "temperature": temp, "top_p": float(body.get("top_p") or 1.0)} \
            if temp > 0 else {"do_sample": False}
        with self.lock:
            hold = self.hold_after is not None and self.requests >= self.hold_after
            if hold:
                self.held += 1
            else:
                self.requests += 1
        if hold:
            self.gate.wait()
        with self.lock, self.torch.no_grad():
            if hold:
                self.requests += 1
            if body.get("seed") is not None:
                self.torch.manual_seed(int(body["seed"]))
            x = self.torch.tensor([ids])
            out = self.model.generate(input_ids=x, attention_mask=self.torch.ones_like(x),
                                      max_new_tokens=int(body.get("max_tokens") or 16),
                                      eos_token_id=stops, pad_token_id=stops[0], **sample)
        new = out[0, len(ids):].tolist()
        cut = next((i for i, t in enumerate(new) if t in stops), None)
        gen = new if cut is None else new[:cut]
        content = self.tok.decode(gen, skip_special_tokens=body.get("skip_special_tokens", True))
        return {"id": f"chatcmpl-{self.requests}", "object": "chat.completion", "model": self.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "length" if cut is None else "stop"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new) if cut is None else cut + 1,
                          "total_tokens": len(ids) + (len(new) if cut is None else cut + 1)}}


def refusal(body: dict) -> str | None:
    """What ``vllm serve`` (no tool parser) answers 400 to, or None."""
    if body.get("tools") and body.get("tool_choice", "auto") == "auto":
        return '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    for m in body.get("messages") or ():
        for c in m.get("tool_calls") or ():
            if not isinstance((c.get("function") or {}).get("arguments"), str) or "id" not in c:
                return "tool_calls: each needs an id and its arguments as a JSON string"
    return None


def make_server(target: str, *, port: int = 0, key: str | None = None) -> ThreadingHTTPServer:
    model = ChatModel(target)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"dfo-chat-standin/{VERSION}"

        def log_message(self, *a):  # quiet
            pass

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if key is None or self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._send(401, {"error": {"message": "bad API key"}})
            return False

        def do_GET(self):  # noqa: N802
            if not self._authorized():
                return
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model.name, "object": "model",
                                                             "owned_by": "standin"}]})
            elif self.path == "/version":
                self._send(200, {"version": VERSION})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
            elif body.get("model") != model.name:
                self._send(404, {"error": {"message": f"model {body.get('model')!r} not served"}})
            elif refused := refusal(body):
                self._send(400, {"error": {"message": refused}})
            else:
                res = model.complete(body)
                if res is None:
                    self._send(500, {"error": {"message": "injected failure"}})
                else:
                    self._send(200, res)

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    srv.model = model  # type: ignore[attr-defined]
    return srv


def serve_in_thread(target: str, *, key: str | None = None):
    """(server, url): serving on a daemon thread until ``server.shutdown()``."""
    srv = make_server(target, key=key)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.helpers.chat_server")
    ap.add_argument("--target", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--key-env", default=None)
    a = ap.parse_args(argv)
    srv = make_server(a.target, port=a.port, key=os.environ.get(a.key_env) if a.key_env else None)
    print(f"listening http://127.0.0.1:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
