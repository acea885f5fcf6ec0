"""Where ``step.build_models`` spends its time (the part of a warm start no snapshot carries).

    python3 bench/build_probe.py --target DIR [--device cuda] [--json OUT.json]

Each figure is measured in a fresh process (the first import of a module is what a start
pays), in one run, side by side:
- ``import torch``; CUDA context (``torch.cuda.init`` + a first allocation);
- ``import transformers`` and the target's modeling module;
- ``from_pretrained`` to the CPU then ``.to(device)`` (what trainer.model.target does) vs
  ``from_pretrained(device_map=device)``;
- the whole ``step.build_models`` as the trainer calls it, sequential vs with the CUDA
  context created in a thread while transformers imports (overlap).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, sys, time, threading
t = {}
t0 = time.perf_counter()
import torch
t["import_torch"] = time.perf_counter() - t0
mode, target, dev = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, sys.argv[4])

def ctx():
    if dev.startswith("cuda"):
        torch.cuda.init(); torch.empty(1, device=dev); torch.cuda.synchronize()

if mode == "parts":
    a = time.perf_counter(); ctx(); t["cuda_context"] = time.perf_counter() - a
    a = time.perf_counter(); import transformers; t["import_transformers"] = time.perf_counter() - a
    a = time.perf_counter()
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3 import modeling_qwen3  # noqa: F401
    t["import_modeling"] = time.perf_counter() - a
    a = time.perf_counter()
    m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16, local_files_only=True)
    t["from_pretrained_cpu"] = time.perf_counter() - a
    a = time.perf_counter(); m.to(dev); torch.cuda.synchronize() if dev.startswith("cuda") else None
    t["to_device"] = time.perf_counter() - a
    del m
    a = time.perf_counter()
    try:  # needs accelerate
        m = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16,
                                                 local_files_only=True, device_map={"": dev})
        torch.cuda.synchronize() if dev.startswith("cuda") else None
        t["from_pretrained_device_map"] = time.perf_counter() - a
    except (ImportError, ValueError):
        pass
else:
    from dfo_contract.trainer_config import load_config
    cfg = load_config(sys.argv[5], [])
    from trainer.core import step
    a = time.perf_counter()
    th = None
    if mode == "overlap":
        th = threading.Thread(target=ctx); th.start()
    step.build_models(cfg, torch.device(dev))
    if th is not None:
        th.join()
    torch.cuda.synchronize() if dev.startswith("cuda") else None
    t["build_models"] = time.perf_counter() - a
print("PROBE " + json.dumps({k: round(v, 3) for k, v in t.items()}))
'''


def child(mode: str, target: str, dev: str, cfg: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, mode, target, dev, str(REPO), cfg],
                       capture_output=True, text=True, cwd=REPO)
    line = [x for x in p.stdout.splitlines() if x.startswith("PROBE ")]
    if p.returncode or not line:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(line[-1][6:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cfg = Path(a.json or "/tmp/build_probe.json").with_suffix(".yaml")
    data = cfg.with_suffix(".jsonl")
    data.write_text('{"input_ids": [5, 6, 7, 8], "loss_mask": [1, 1, 1, 1]}\n')
    cfg.write_text("model: {target_path: %s, drafter_layers: 2, block_size: 16, mask_token_id: 3}\n"
                   "data: {path: %s}\n"
                   "parallel: {target_devices: ['%s'], drafter_devices: ['%s']}\n"
                   % (a.target, data, a.device, a.device))
    out = {"parts": child("parts", a.target, a.device, str(cfg)),
           "build_sequential": child("sequential", a.target, a.device, str(cfg)),
           "build_overlap": child("overlap", a.target, a.device, str(cfg))}
    for k, v in out.items():
        print(f"{k}: " + ", ".join(f"{n} {s} s" if not isinstance(s, str) else f"{n}: {s}"
                                  for n, s in v.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
