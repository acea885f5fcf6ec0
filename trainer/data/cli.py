"""``python -m trainer.data {synth,tokenize,regenerate}``.

- ``synth --out FILE.jsonl [--num N --seq-len S --vocab V --seed K]``: a learnable synthetic
  tokenized dataset.
- ``tokenize --target DIR --in FILE... --out DIR [--workers N] [--no-thinking]``: build a
  pre-tokenized store (trainer.data.tokenized) in parallel over the cores, with a progress bar
  and a summary (samples, skipped records by reason with the first file:line, loss tokens,
  length histogram). It warns when an input's regenerate metadata disagrees with
  ``--no-thinking`` (trainer.data.meta).
- ``regenerate --target DIR --in FILE --out FILE --thinking on|off [--batch-size N]
  [--max-new-tokens N] [--engine transformers|openai|vllm] [--url URL --concurrency N
  --api-key-env VAR --model NAME] [--temperature T --top-p P --seed S] [--max-model-len N]``:
  the target rewrites the assistant turns (trainer.data.regenerate, trainer.data.engines);
  resumable after a kill.

User errors print one line ``trainer.data: ...`` and exit 2 (usage: also an engine that
cannot start, a server that cannot be reached at the start or refuses the key) or 3 (data);
a worker process that dies, or a server that keeps failing a request, exits 5
(dfo_contract.exitcodes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dfo_contract.exitcodes import DataError, TrainerConfigError, TrainerError

from .progress import Progress


def target_vocab_size(target: str) -> int:
    p = os.path.join(target, "config.json")
    try:
        with open(p) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"--target: {p}: unreadable ({e}); give a transformers model directory") from None
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(v, int):
        raise DataError(f"--target: {p}: no vocab_size")
    return v


def cmd_tokenize(a) -> int:
    from .formats import count_records
    from .meta import thinking_warnings
    from .tokenized import write_store

    vocab = target_vocab_size(a.target)
    for p in a.inputs:
        if not os.path.isfile(p):
            raise DataError(f"--in: {p}: no such file")
    for line in thinking_warnings(a.inputs, a.no_thinking):
        print(line, file=sys.stderr, flush=True)
    total = sum(count_records(p) or 0 for p in a.inputs) or None
    workers = a.workers or max(1, os.cpu_count() or 1)
    prog = Progress(total, "tokenize")
    kw = {"enable_thinking": False} if a.no_thinking else {}
    try:
        s = write_store(a.out, a.inputs, target=a.target, vocab_size=vocab, fmt=a.format,
                        workers=workers, template_kwargs=kw, progress=prog)
    finally:
        prog.close()
    for line in s.lines():
        print(line)
    print(f"wrote {a.out} (use it as --data.path)")
    return 0


def cmd_regenerate(a) -> int:
    from .regenerate import regenerate

    from .formats import count_records

    from .engines import EngineSpec, Sampling

    if a.engine != "openai" and (a.url or a.api_key_env or a.model):
        raise TrainerConfigError(f"--url/--api-key-env/--model: only for --engine openai (not {a.engine})")
    spec = EngineSpec(a.engine, device=a.device, batch_size=a.batch_size, url=a.url,
                      concurrency=a.concurrency, api_key_env=a.api_key_env, model=a.model,
                      max_model_len=a.max_model_len)
    sampling = Sampling(a.max_new_tokens, temperature=a.temperature, top_p=a.top_p, seed=a.seed)
    prog = Progress(count_records(a.inp) if os.path.isfile(a.inp) else None, "regenerate",
                    every_s=a.progress_every)
    n, skipped = regenerate(a.target, a.inp, a.out, batch_size=a.batch_size, thinking=a.thinking,
                            engine=spec, sampling=sampling, max_model_len=a.max_model_len,
                            progress=prog)
    print(f"regenerated {n} samples into {a.out} ({skipped} already done) with {a.engine}; "
          f"thinking {a.thinking}, recorded in {a.out}.meta.json")
    for line in prog.summary.lines()[1:]:
        if line.startswith("dropped"):
            print(line.replace("dropped", "skipped", 1))
    return 0


def cmd_synth(a) -> int:
    from .synth import write_synth

    try:
        write_synth(a.out, num=a.num, seq_len=a.seq_len, vocab=a.vocab, seed=a.seed, reserve=a.reserve)
    except ValueError as e:
        print(f"trainer.data: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.num} synthetic samples to {a.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trainer.data")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("synth", help="write a synthetic tokenized JSONL dataset")
    sp.add_argument("--out", required=True)
    sp.add_argument("--num", type=int, default=256)
    sp.add_argument("--seq-len", type=int, default=64)
    sp.add_argument("--vocab", type=int, default=128)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--reserve", type=int, default=4,
                    help="ids below this are never used (specials; the tiny target's mask is 3)")
    sp.set_defaults(fn=cmd_synth)
    tp = sub.add_parser("tokenize", help="pre-tokenize chat/tokenized records into a store")
    tp.add_argument("--target", required=True, help="the target model directory (its tokenizer)")
    tp.add_argument("--in", dest="inputs", nargs="+", required=True,
                    help=".jsonl, .jsonl.gz or .parquet files")
    tp.add_argument("--out", required=True, help="the store directory to write")
    tp.add_argument("--workers", type=int, default=0, help="processes (default: all cores)")
    tp.add_argument("--format", default="auto", choices=["auto", "tokens", "chat"])
    tp.add_argument("--no-thinking", action="store_true",
                    help="render with enable_thinking=False (the template's empty think block)")
    tp.set_defaults(fn=cmd_tokenize)
    rp = sub.add_parser("regenerate", help="the target rewrites the assistant turns")
    rp.add_argument("--target", required=True)
    rp.add_argument("--in", dest="inp", required=True)
    rp.add_argument("--out", required=True, help="JSONL, appended to (resumable)")
    rp.add_argument("--batch-size", type=int, default=32,
                    help="conversations open at once: each round asks the engine for the next "
                         "turn of every one of them (transformers: the rows of one generate)")
    rp.add_argument("--max-new-tokens", type=int, default=1024)
    rp.add_argument("--engine", default="transformers", choices=["transformers", "openai", "vllm"],
                    help="transformers (the reference), openai (a server by --url), vllm (in-process)")
    rp.add_argument("--device", default="auto",
                    help="transformers: auto (cuda if available), cpu, cuda, cuda:N")
    rp.add_argument("--url", default=None,
                    help="openai: the server's base URL, http://HOST:PORT or http://HOST:PORT/v1")
    rp.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight")
    rp.add_argument("--api-key-env", default=None,
                    help="openai: the environment variable holding the API key (never logged)")
    rp.add_argument("--model", default=None, help="openai: the served model (default: the first listed)")
    rp.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    rp.add_argument("--top-p", type=float, default=1.0)
    rp.add_argument("--seed", type=int, default=None)
    rp.add_argument("--max-model-len", type=int, default=None,
                    help="the context: a record whose prompt + --max-new-tokens exceeds it is "
                         "skipped (default: the target's max_position_embeddings)")
    rp.add_argument("--progress-every", type=float, default=5.0,
                    help="seconds between progress lines when not on a terminal")
    rp.add_argument("--thinking", required=True, choices=["on", "off"],
                    help="enable_thinking passed to the chat template when generating; recorded "
                         "in OUT.meta.json (tokenize with --no-thinking what was made with off)")
    rp.set_defaults(fn=cmd_regenerate)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except TrainerError as e:
        print(f"trainer.data: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        print("trainer.data: interrupted", file=sys.stderr, flush=True)
        return 130
