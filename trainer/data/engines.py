"""The engines ``regenerate`` asks for the target's replies: one seam, one class per engine.

An engine takes a list of :class:`TurnRequest` (a conversation so far, its tools, and the same
conversation rendered by the target's chat template with the generation prompt, as token
ids) and returns one :class:`TurnReply` per request, in order. ``open_engine`` is the one place
that chooses the engine:

- ``transformers``: ``model.generate`` in left-padded batches of ``batch_size`` (the
  reference: what the other engines are compared with);
- ``openai``: any OpenAI-compatible server (a running vLLM or SGLang) by URL,
  ``/v1/chat/completions`` with ``concurrency`` requests in flight; ``enable_thinking``
  travels as ``chat_template_kwargs``, the end-of-turn token as ``stop_token_ids``;
- ``vllm``: ``vllm.LLM`` in this process (prefix caching, continuous batching) on the
  rendered prompt's token ids; vllm is imported only when chosen.

Every engine stops a reply at the template's end-of-turn token or at ``max_new_tokens``,
and greedy is the default (:class:`Sampling`).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from dfo_contract.exitcodes import TrainerConfigError, TrainerError

ENGINES = ("transformers", "openai", "vllm")


@dataclass(frozen=True)
class Sampling:
    """How replies are drawn; ``temperature`` 0 is greedy (the default)."""
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def record(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TurnRequest:
    messages: list[dict]        # the conversation so far (OpenAI form)
    tools: list | None
    prompt_ids: list[int]       # the same, rendered with the generation prompt, tokenized


@dataclass(frozen=True)
class TurnReply:
    text: str                   # the reply as generated (a ``<think>`` block inline)
    tokens: int                 # tokens generated, the end-of-turn token included
    reasoning: str | None = None     # where a server returned the reasoning apart
    tool_calls: list | None = None   # where a server parsed tool calls out of the text


@dataclass(frozen=True)
class EngineInfo:
    """What ``OUT.meta.json`` records about the engine (never a key)."""
    name: str
    version: str
    host: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class EngineSpec:
    """The engine the command line chose and its own settings."""
    name: str = "transformers"
    device: str = "auto"             # transformers
    batch_size: int = 32             # transformers: rows per generate call
    url: str | None = None           # openai
    concurrency: int = 8             # openai: requests in flight
    api_key_env: str | None = None   # openai: the variable holding the key
    model: str | None = None         # openai: the served model's name (default: the first listed)
    max_model_len: int | None = None  # vllm: the context it allocates


OnReply = Callable[[TurnReply], None]


class Engine(Protocol):
    info: EngineInfo

    def generate(self, requests: list[TurnRequest], on_reply: OnReply | None = None) -> list[TurnReply]:
        """One reply per request, in order; ``on_reply`` is called as each one arrives."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class TargetInfo:
    """What every engine needs to know about the target."""
    path: str
    tokenizer: Any
    eot_id: int                      # the end-of-turn token a reply stops at
    template_kwargs: dict            # ``enable_thinking``


def _split_url(url: str) -> tuple[urllib.parse.SplitResult, str]:
    """``url`` (``http://`` when it names no scheme) split, and its host; a
    TrainerConfigError when it is not an http(s) URL with a host."""
    u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise TrainerConfigError(f"--url {url}: not an http(s) URL; give http://HOST:PORT")
    return u, u.hostname


def check_spec(spec: EngineSpec) -> str | None:
    """What the command line got wrong about the engine (checked before anything starts);
    returns the API key (from ``api_key_env``) for an openai engine."""
    if spec.name not in ENGINES:
        raise TrainerConfigError(f"--engine {spec.name}: unknown; expected one of {', '.join(ENGINES)}")
    if spec.name != "openai":
        return None
    if not spec.url:
        raise TrainerConfigError("--engine openai: no --url; give the server's base URL "
                                 "(http://HOST:PORT or http://HOST:PORT/v1)")
    _split_url(spec.url)
    if spec.concurrency < 1:
        raise TrainerConfigError("--concurrency: must be >= 1")
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise TrainerConfigError(f"--api-key-env {spec.api_key_env}: the variable is not "
                                     "set or empty; export it, or drop --api-key-env")
        return key
    return None


def open_engine(spec: EngineSpec, target: TargetInfo, sampling: Sampling) -> Engine:
    """The engine ``spec`` names (the one place an engine is chosen)."""
    key = check_spec(spec)
    if spec.name == "transformers":
        return TransformersEngine(target, sampling, device=spec.device, batch_size=spec.batch_size)
    if spec.name == "openai":
        return OpenAIEngine(spec.url or "", target, sampling, concurrency=spec.concurrency, api_key=key,
                            model=spec.model)
    return VllmEngine(target, sampling, max_model_len=spec.max_model_len)


# --- transformers ----------------------------------------------------------------------------

def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class TransformersEngine:
    def __init__(self, target: TargetInfo, sampling: Sampling, *, device: str, batch_size: int):
        import torch
        import transformers

        from ..model.hf_load import from_pretrained, quiet_transformers

        quiet_transformers()
        self.tok, self.eot, self.s = target.tokenizer, target.eot_id, sampling
        self.dev = _device(device)
        dtype = torch.bfloat16 if self.dev.type == "cuda" else torch.float32
        self.model = from_pretrained(target.path, dtype)
        self.model.to(self.dev).eval()
        self.batch = batch_size
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eot
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        self.info = EngineInfo("transformers", transformers.__version__, model=target.path)

    def _batch(self, enc: list[list[int]]) -> list[TurnReply]:
        import torch

        n = max(len(e) for e in enc)
        ids = torch.full((len(enc), n), self.pad, dtype=torch.long)
        att = torch.zeros((len(enc), n), dtype=torch.long)
        for i, e in enumerate(enc):  # left padding
            ids[i, n - len(e):] = torch.tensor(e)
            att[i, n - len(e):] = 1
        kw = {"do_sample": False} if self.s.greedy else \
            {"do_sample": True, "temperature": self.s.temperature, "top_p": self.s.top_p}
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.dev), attention_mask=att.to(self.dev),
                                      max_new_tokens=self.s.max_new_tokens, eos_token_id=self.eot,
                                      pad_token_id=self.pad, **kw)
        replies = []
        for row in out[:, n:].tolist():
            ntok = row.index(self.eot) + 1 if self.eot in row else len(row)
            row = row[: ntok - 1] if self.eot in row else row
            replies.append(TurnReply(self.tok.decode(row, skip_special_tokens=True), ntok))
        return replies

    def generate(self, requests: list[TurnRequest], on_reply: OnReply | None = None) -> list[TurnReply]:
        out: list[TurnReply] = []
        for i in range(0, len(requests), self.batch):
            got = self._batch([r.prompt_ids for r in requests[i:i + self.batch]])
            for r in got:
                if on_reply:
                    on_reply(r)
            out += got
        return out

    def close(self) -> None:
        pass


# --- an OpenAI-compatible server ----------------------------------------------------------------

class ServerError(TrainerError):
    """The server failed a request after its retries (exit 5: a supervised job restarts and
    resumes)."""

    def __init__(self, message: str, *, detail: str = ""):
        super().__init__(message)
        self.detail = detail


RETRIES = 4


def _one_line(data: bytes) -> str:
    return " ".join(data.decode(errors="replace").split())


def wire_messages(messages: list[dict]) -> list[dict]:
    """Messages in the API's form: each tool call with an ``id`` and its ``arguments`` as a
    JSON string (servers parse them back into the object the template renders)."""
    out = []
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            m = dict(m)
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = dict(c.get("function") or {})
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
                calls.append({"id": c.get("id") or f"call_{i}_{j}", "type": "function", "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


class OpenAIEngine:
    def __init__(self, url: str, target: TargetInfo, sampling: Sampling, *, concurrency: int,
                 api_key: str | None, model: str | None, timeout_s: float = 900.0):
        u, self.host = _split_url(url)
        self.https = u.scheme == "https"
        self.port = u.port
        path = u.path.rstrip("/")
        self.base = path if path.endswith("/v1") else path + "/v1"
        self.root = self.base[: -len("/v1")]
        self.key, self.timeout = api_key, timeout_s
        self.s, self.eot, self.kw = sampling, target.eot_id, dict(target.template_kwargs)
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen-http")
        try:
            status, headers, body = self._call("GET", self.base + "/models", None, retries=1)
        except ServerError as e:
            raise TrainerConfigError(f"--url {url}: cannot reach the server ({e.detail}); start it, "
                                     "or fix the URL") from None
        if status == 401 or status == 403:
            raise TrainerConfigError(f"--url {url}: GET /v1/models answered {status}; give the key "
                                     "with --api-key-env VAR")
        if status != 200:
            raise TrainerConfigError(f"--url {url}: GET /v1/models answered {status}; is it an "
                                     "OpenAI-compatible server?")
        try:
            listed = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise TrainerConfigError(f"--url {url}: GET /v1/models did not list models") from None
        if model is not None and model not in listed:
            raise TrainerConfigError(f"--model {model}: not served at {url} (it serves "
                                     f"{', '.join(listed) or 'nothing'})")
        if model is None and not listed:
            raise TrainerConfigError(f"--url {url}: the server lists no model")
        self.model = model or listed[0]
        version = headers.get("server") or "unknown"
        vs, _, vb = self._call("GET", self.root + "/version", None, retries=1)
        if vs == 200:
            try:
                version = str(json.loads(vb)["version"])
            except (ValueError, KeyError, TypeError):
                pass
        self.info = EngineInfo("openai", version, host=u.netloc.rsplit("@", 1)[-1], model=self.model)

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self.local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            c = self.local.conn = cls(self.host, self.port, timeout=self.timeout)
        return c

    def _call(self, method: str, path: str, payload: dict | None,
              retries: int = RETRIES) -> tuple[int, dict, bytes]:
        """One request on this thread's connection; a dropped connection is retried with
        backoff, then ``ServerError``."""
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        body = None if payload is None else json.dumps(payload).encode()
        err = ""
        for attempt in range(retries):
            try:
                c = self._conn()
                c.request(method, path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                if r.status < 500:
                    return r.status, {k.lower(): v for k, v in r.getheaders()}, data
                err = f"{r.status} {_one_line(data[:200])}"
            except (OSError, http.client.HTTPException) as e:
                err = f"{type(e).__name__}: {e}"
                self.local.conn = None
            if attempt + 1 < retries:
                time.sleep(min(0.5 * 2 ** attempt, 8.0))
        raise ServerError(f"--url: {method} {path} on {self.host}:{self.port} failed {retries} "
                          f"times (last: {err}); is the server up?", detail=err)

    def _payload(self, req: TurnRequest) -> dict:
        p: dict = {"model": self.model, "messages": wire_messages(req.messages),
                   "max_tokens": self.s.max_new_tokens,
                   "temperature": self.s.temperature, "top_p": self.s.top_p,
                   "chat_template_kwargs": self.kw, "stop_token_ids": [self.eot],
                   "skip_special_tokens": True}
        if req.tools is not None:
            # the tools reach the template; "none": the reply is text, as the reference's
            # (vLLM's default "auto" needs its tool parser and would parse the calls out)
            p["tools"], p["tool_choice"] = req.tools, "none"
        if self.s.seed is not None:
            p["seed"] = self.s.seed
        return p

    def _one(self, req: TurnRequest, on_reply: OnReply | None) -> TurnReply:
        status, _, body = self._call("POST", self.base + "/chat/completions", self._payload(req))
        if status != 200:
            raise ServerError(f"--url: POST /v1/chat/completions answered {status}: "
                              f"{_one_line(body[:300])}")
        try:
            res = json.loads(body)
            msg = res["choices"][0]["message"]
            tokens = int((res.get("usage") or {}).get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise ServerError("--url: POST /v1/chat/completions answered without choices[0].message")\
                from None
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        rep = TurnReply(msg.get("content") or "", tokens, reasoning or None, msg.get("tool_calls") or None)
        if on_reply:
            on_reply(rep)
        return rep

    def generate(self, requests: list[TurnRequest], on_reply: OnReply | None = None) -> list[TurnReply]:
        return list(self.pool.map(lambda r: self._one(r, on_reply), requests))

    def close(self) -> None:
        self.pool.shutdown(wait=True)


# --- vLLM in this process -----------------------------------------------------------------------

class VllmEngine:
    def __init__(self, target: TargetInfo, sampling: Sampling, *, max_model_len: int | None):
        try:
            import vllm
        except ImportError:
            raise TrainerConfigError("--engine vllm: vllm is not installed in this env; install it "
                                     "(pip install vllm), or serve the target with vllm/sglang and "
                                     "use --engine openai --url URL") from None
        import torch

        kw = {"max_model_len": max_model_len} if max_model_len else {}
        # the reference's dtypes (vLLM's "auto" would run a float32 checkpoint in bf16)
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        self.llm = vllm.LLM(model=target.path, enable_prefix_caching=True, dtype=dtype,
                            seed=sampling.seed if sampling.seed is not None else 0, **kw)
        self.params = vllm.SamplingParams(max_tokens=sampling.max_new_tokens,
                                          temperature=sampling.temperature,
                                          top_p=sampling.top_p, seed=sampling.seed,
                                          stop_token_ids=[target.eot_id], skip_special_tokens=True)
        self.info = EngineInfo("vllm", vllm.__version__, model=target.path)

    def generate(self, requests: list[TurnRequest], on_reply: OnReply | None = None) -> list[TurnReply]:
        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        replies = []
        for o in outs:
            c = o.outputs[0]
            rep = TurnReply(c.text, len(c.token_ids))
            if on_reply:
                on_reply(rep)
            replies.append(rep)
        return replies

    def close(self) -> None:
        pass
