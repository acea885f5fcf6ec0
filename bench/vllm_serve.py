"""Serve a target with a dfo-exported DFlash drafter in vLLM and decode greedily, once with
speculation and once without. Runs under a venv that holds vLLM (its CPU build on a
machine without a GPU), not under dfo's: it imports vLLM and the standard library only.

    VLLM_PY bench/vllm_serve.py --target DIR --drafter EXPORT --prompts FILE \
        [--prompt-len 8] [--new 48] [--max-prompts 16] --out OUT.json

``--prompts``: JSONL with ``input_ids`` per line; each prompt is its first ``--prompt-len``
ids. OUT.json: both decodings' token ids, whether they are equal, and vLLM's
speculative-decoding counters (drafts, draft tokens, accepted tokens, accepted per
position) read from ``LLM.get_metrics()``. When vLLM raises while serving the drafter,
OUT.json holds ``error`` instead: the exception, its message and the innermost vLLM frame
(file, line, function), with ``traceback`` (the engine runs in this process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the exception is vLLM's own, not a wrapper's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def counters(llm) -> dict:
    """vLLM's spec-decode counters (prometheus names without the ``vllm:`` prefix)."""
    out: dict = {}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:")
        if not name.startswith("spec_decode"):
            continue
        if hasattr(m, "values"):   # a vector: one value per position
            out[name] = [int(x) for x in m.values]
        else:
            out[name] = int(m.value)
    return out


def decode(args, prompts: list[list[int]], speculative: bool) -> tuple[list[list[int]], dict, float]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if speculative:
        with open(os.path.join(args.drafter, "config.json")) as f:
            block = int(json.load(f)["block_size"])
        kw["speculative_config"] = {"method": "dflash", "model": args.drafter,
                                    "num_speculative_tokens": block - 1}
    llm = LLM(model=args.target, skip_tokenizer_init=True, dtype="float32", seed=0,
              max_model_len=args.prompt_len + args.new + 64, enforce_eager=True,
              gpu_memory_utilization=args.memory_share, max_num_seqs=len(prompts),
              disable_log_stats=False, **kw)
    sp = SamplingParams(temperature=0.0, max_tokens=args.new, ignore_eos=True,
                        detokenize=False)
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                        use_tqdm=False)
    seconds = time.perf_counter() - t
    ids = [list(o.outputs[0].token_ids) for o in outs]
    stats = counters(llm) if speculative else {}
    del llm
    return ids, stats, seconds


def where(e: BaseException) -> str:
    """``Type: message (at vllm/FILE:LINE in FUNCTION)``: the innermost frame inside vLLM."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/vllm/" in f.filename]
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if len(lines) > 1 and "validation error" in lines[0]:   # pydantic: the reason follows
        why = [ln for ln in lines[1:] if ln.startswith(("Value error,", "Assertion failed,"))]
        lines = [(why or lines[1:])[0].split(" [type=")[0]]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    if not frames:
        return msg
    f = frames[-1]
    return f"{msg} (at vllm/{f.filename.rsplit('/vllm/', 1)[1]}:{f.lineno} in {f.name})"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--max-prompts", type=int, default=16)
    ap.add_argument("--memory-share", type=float, default=0.1,
                    help="vLLM's gpu_memory_utilization: on its CPU backend, the share of RAM it takes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    prompts = []
    with open(args.prompts) as f:
        for line in f:
            if line.strip():
                prompts.append(json.loads(line)["input_ids"][: args.prompt_len])
            if len(prompts) >= args.max_prompts:
                break
    import vllm

    try:   # speculation first: a drafter vLLM refuses is reported without the plain run
        spec, stats, t_spec = decode(args, prompts, speculative=True)
    except Exception as e:  # noqa: BLE001 - reported, not hidden: the bench says where vLLM stopped
        res = {"vllm": vllm.__version__, "error": where(e),
               "traceback": "".join(traceback.format_exception(e))[-6000:]}
        with open(args.out, "w") as f:
            json.dump(res, f)
        print(res["traceback"], file=sys.stderr)
        print(json.dumps({"vllm": res["vllm"], "error": res["error"]}))
        return 0
    plain, _, t_plain = decode(args, prompts, speculative=False)
    res = {"vllm": vllm.__version__, "prompts": prompts, "plain": plain, "speculative": spec,
           "identical": plain == spec, "stats": stats,
           "seconds": {"plain": round(t_plain, 3), "speculative": round(t_spec, 3)}}
    drafts = stats.get("spec_decode_num_drafts") or 0
    if drafts:
        res["acceptance_length"] = 1 + stats["spec_decode_num_accepted_tokens"] / drafts
    with open(args.out, "w") as f:
        json.dump(res, f)
    print(json.dumps({k: v for k, v in res.items() if k not in ("prompts", "plain", "speculative")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
