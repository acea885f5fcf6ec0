"""``trainer.data tokenize`` throughput with Qwen3's real chat template and tokenizer.

    python3 bench/bench_tokenize_qwen3.py [--records 4000] [--workers 1,16] [--tokenizer DIR]
        [--template FILE] [--no-thinking] [--seed 0] [--keep DIR]

Generates realistic multi-turn chats (a system prompt, 2-4 user/assistant exchanges of
varied prose and code, reasoning_content on some turns, tool calls with tool results on
some records; about 770 Qwen3 tokens each), then runs ``python -m trainer.data tokenize``
once per worker count and prints ONE JSON line: per run the wall seconds, records/s, the
CPU seconds of the tokenize process and its workers together (user+sys from
``resource.getrusage(RUSAGE_CHILDREN)``, which a loaded machine inflates far less than wall
time) and per record, the parent's own CPU seconds (start-up, reading lines, writing the
store; ``parent_cpu_s``), the mean tokens per record, whether every store is
byte-identical to the first, two start-up runs over 16 records (1 worker and the widest
count), and a projection for ``--project`` cores (default 16) from these CPU figures,
labelled as such.

``--tokenizer`` is a directory with ``tokenizer.json`` (or ``tokenizer.json.gz``) and
``tokenizer_config.json``; ``--template`` a Jinja chat template file that replaces the
config's. Both default to the shared Qwen3 fixtures (``$DFO_QWEN3_FIXTURES``, else
``shared/fixtures/qwen3`` above this repository; the hybrid template). Needs python3 with
transformers, tokenizers and numpy; no torch, no network.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = 16  # records of the start-up runs
FILES = ("tokens.u32", "offsets.i64", "loss.bits", "origin.i64")

WORDS = ("the a of to and in is that for it as with was on be by this are from at or an have not "
         "which but can will their more one all would there been has when who what so if about "
         "into than them its only other some could time these two may then do first any new "
         "like our used also over such most after should well where way because each between "
         "system data model value function result number process change error memory request "
         "server cache training token batch layer network query update table field record "
         "performance latency throughput gradient matrix vector sample index string integer "
         "response configuration parameter dependency interface database schema migration "
         "Paris Oslo Tokyo Berlin river mountain weather history science energy market policy "
         "example because however therefore although usually quickly carefully directly").split()
CODE = ["def {f}(items):\n    total = 0\n    for x in items:\n        total += x * {k}\n    return total\n",
        "for (int i = 0; i < {k}; ++i) {{\n    buf[i] = {f}(i);\n}}\n",
        "SELECT {f}, COUNT(*) FROM events WHERE id > {k} GROUP BY {f};\n",
        "const {f} = async (url) => {{\n  const r = await fetch(url);\n  return r.json();\n}};\n"]
TOOLS = [{"type": "function", "function": {
    "name": n, "description": d,
    "parameters": {"type": "object", "properties": {p: {"type": "string", "description": f"the {p}"}},
                   "required": [p]}}} for n, d, p in (
    ("get_weather", "Current weather of a city", "city"),
    ("search_web", "Search the web and return the top results", "query"),
    ("run_sql", "Run a read-only SQL query", "sql"))]


SYLLABLES = [c + v for c in ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s",
                              "t", "v", "w", "z", "br", "ch", "st", "tr", "sh", "pl", "gr")
             for v in ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "er", "an", "in", "on")]


def lexicon(seed: int, size: int = 40000) -> tuple[list[str], list[float]]:
    """The common words above, then ``size`` made-up words of 1-4 syllables, with Zipf
    cumulative weights: like real text, most words repeat and a long tail does not, so the
    tokenizer's word cache misses about as often as on real data."""
    rng = random.Random(seed + 1)
    words = list(WORDS) + ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
                           for _ in range(size)]
    cum, total = [], 0.0
    for rank in range(len(words)):
        total += 1.0 / (rank + 1)
        cum.append(total)
    return words, cum


_LEX: dict = {}


def sentence(rng: random.Random, n: int) -> str:
    if "words" not in _LEX:
        _LEX["words"], _LEX["cum"] = lexicon(0)
    words = rng.choices(_LEX["words"], cum_weights=_LEX["cum"], k=n)
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice((".", ".", ".", "?", "!"))


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng, rng.randint(6, 18)) for _ in range(sentences))


def reply(rng: random.Random) -> str:
    parts = [paragraph(rng, rng.randint(3, 6))]
    if rng.random() < 0.3:
        code = rng.choice(CODE).format(f=rng.choice(("score", "scale", "norm", "mix")), k=rng.randint(2, 99))
        parts.append(f"```\n{code}```")
    if rng.random() < 0.4:
        parts.append("\n".join(f"- {sentence(rng, rng.randint(4, 9))}" for _ in range(rng.randint(2, 4))))
    return "\n\n".join(parts)


def chat(rng: random.Random) -> dict:
    """One record: system, 2-4 exchanges; reasoning on ~half the replies; tool calls on ~1/4."""
    msgs = [{"role": "system", "content": paragraph(rng, rng.randint(1, 3))}]
    tools = rng.random() < 0.25
    for _ in range(rng.randint(2, 4)):
        msgs.append({"role": "user", "content": paragraph(rng, rng.randint(1, 4))})
        if tools and rng.random() < 0.5:
            t = rng.choice(TOOLS)["function"]
            arg = next(iter(t["parameters"]["properties"]))
            msgs.append({"role": "assistant", "content": rng.choice(("", sentence(rng, 8))),
                         "reasoning_content": sentence(rng, 14),
                         "tool_calls": [{"type": "function", "function": {
                             "name": t["name"], "arguments": {arg: sentence(rng, 3)}}}]})
            msgs.append({"role": "tool", "content": json.dumps({"result": sentence(rng, 12)})})
        m = {"role": "assistant", "content": reply(rng)}
        if rng.random() < 0.5:
            m["reasoning_content"] = paragraph(rng, rng.randint(1, 3))
        msgs.append(m)
    return {"messages": msgs, "tools": TOOLS} if tools else {"messages": msgs}


def fixtures() -> Path | None:
    env = os.environ.get("DFO_QWEN3_FIXTURES")
    cands = [Path(env)] if env else [p / "shared" / "fixtures" / "qwen3" for p in [REPO, *REPO.parents]]
    return next((d for d in cands if (d / "tokenizer").is_dir()), None)


def make_target(dest: Path, tokenizer: str | None, template: str | None) -> Path:
    """config.json (Qwen3's vocab) + tokenizer.json + tokenizer_config.json (with ``template``)."""
    fx = fixtures()
    if tokenizer is None:
        if fx is None:
            raise SystemExit("bench: no --tokenizer and no Qwen3 fixtures (set $DFO_QWEN3_FIXTURES)")
        tokenizer = str(fx / "tokenizer")
        template = template or str(fx / "templates" / "qwen3-hybrid.jinja")
    src = Path(tokenizer)
    dest.mkdir(parents=True)
    if (src / "tokenizer.json").is_file():
        shutil.copy(src / "tokenizer.json", dest / "tokenizer.json")
    else:
        with gzip.open(src / "tokenizer.json.gz", "rb") as f, open(dest / "tokenizer.json", "wb") as o:
            shutil.copyfileobj(f, o)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    if template:
        cfg["chat_template"] = Path(template).read_text()
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    vocab = max(151936, max((int(k) for k in cfg.get("added_tokens_decoder", {})), default=0) + 1)
    (dest / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab}))
    return dest


def store_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in FILES:
        h.update((path / f).read_bytes())
    return h.hexdigest()


# Runs ``python -m trainer.data`` in-process and reports its own CPU seconds (the parent:
# start-up, reading, writing) apart from its workers' on the last stderr line.
WRAP = """import json, resource, sys
from trainer.data.cli import main
try:
    rc = main(sys.argv[1:])
finally:
    s = resource.getrusage(resource.RUSAGE_SELF)
    print("RUSAGE " + json.dumps(s.ru_utime + s.ru_stime), file=sys.stderr)
sys.exit(rc)
"""


def run(target: Path, src: Path, out: Path, workers: int, extra: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", WRAP, "tokenize", "--target", str(target),
                        "--in", str(src), "--out", str(out), "--workers", str(workers), *extra],
                       cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"bench: tokenize --workers {workers} failed ({r.returncode}): {r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    parent = float(r.stderr.strip().splitlines()[-1].removeprefix("RUSAGE "))
    return {"workers": workers, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "parent_cpu_s": round(parent, 2), "summary": r.stdout.splitlines()[0]}


def projection(runs: list[dict], tiny: dict[int, dict], records: int, cores: int) -> dict:
    """records/s on ``cores`` idle cores, from measured CPU seconds (not a measurement): the
    start-up (a 1-worker run over a few records) runs once; workers start in parallel (the
    per-worker CPU of a run over a few records with the widest worker count); then ``cores``
    workers share the 1-worker run's per-record CPU, unless the parent's own per-record CPU
    (reading lines, writing the store; the widest run's parent less its start-up) is slower."""
    one = next((r for r in runs if r["workers"] == 1), None)
    many = max(runs, key=lambda r: r["workers"])
    if one is None or many["workers"] < 2:
        return {"note": "needs a 1-worker run and a run with 2 or more workers"}
    w = many["workers"]
    startup = tiny[1]["cpu_s"]
    per_worker = max(tiny[w]["cpu_s"] - startup, 0.0) / w
    worker = max(one["cpu_s"] - startup, 0.0) / records
    parent = max(many["parent_cpu_s"] - tiny[w]["parent_cpu_s"], 0.0) / records
    steady = 1 / max(worker / cores, parent, 1e-12)
    return {"kind": "PROJECTION from CPU seconds, not a measurement", "cores": cores,
            "startup_cpu_s": round(startup, 2), "per_worker_start_cpu_s": round(per_worker, 3),
            "worker_cpu_ms_per_record": round(1000 * worker, 3),
            "parent_cpu_ms_per_record": round(1000 * parent, 4),
            "records_per_s": round(records / (startup + per_worker + records / steady), 1),
            "records_per_s_steady": round(steady, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--workers", default=f"1,{os.cpu_count() or 1}",
                    help="comma-separated worker counts, one run each (default 1,all cores)")
    ap.add_argument("--tokenizer", help="directory with tokenizer.json[.gz] and tokenizer_config.json")
    ap.add_argument("--template", help="a Jinja chat template file (default: the config's, or "
                                       "the fixtures' Qwen3 hybrid template)")
    ap.add_argument("--no-thinking", action="store_true", help="tokenize with --no-thinking")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--project", type=int, default=16, help="cores to project records/s for")
    ap.add_argument("--keep", help="write the data, target and stores here (default: a temp dir)")
    a = ap.parse_args()
    counts = [int(w) for w in a.workers.split(",") if w.strip()]
    extra = ["--no-thinking"] if a.no_thinking else []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        target = make_target(root / "target", a.tokenizer, a.template)
        rng = random.Random(a.seed)
        src = root / "chats.jsonl"
        with open(src, "w") as f:
            for _ in range(a.records):
                f.write(json.dumps(chat(rng)) + "\n")
        few = root / "few.jsonl"
        few.write_text("".join(src.read_text().splitlines(keepends=True)[:TINY]))
        tiny = {}
        for w in sorted({1, max(counts)}):
            shutil.rmtree(root / "store-tiny", ignore_errors=True)
            tiny[w] = run(target, few, root / "store-tiny", w, extra)
        runs, digests = [], []
        for w in counts:
            out = root / f"store-{w}"
            if out.exists():
                shutil.rmtree(out)
            r = run(target, src, out, w, extra)
            manifest = json.loads((out / "manifest.json").read_text())
            r["records_per_s"] = round(a.records / r["wall_s"], 1)
            r["cpu_ms_per_record"] = round(1000 * r["cpu_s"] / a.records, 3)
            r["parent_cpu_ms_per_record"] = round(1000 * r["parent_cpu_s"] / a.records, 3)
            runs.append(r)
            digests.append(store_digest(out))
        res = {"bench": "tokenize_qwen3", "records": a.records, "cores": os.cpu_count(),
               "tokens_per_record": round(manifest["num_tokens"] / max(manifest["num_samples"], 1), 1),
               "kept": manifest["num_samples"], "runs": runs,
               "identical": all(d == digests[0] for d in digests),
               "startup_runs": {f"{TINY} records, {w} workers": {k: r[k] for k in ("wall_s", "cpu_s", "parent_cpu_s")}
                                for w, r in tiny.items()},
               "projection": projection(runs, tiny, a.records, a.project),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(res))
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
