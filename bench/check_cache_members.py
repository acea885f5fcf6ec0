"""Does a real GPU compile cache hold only regular files and directories?

dfo's snapshots refuse symlinks, hard links and special files. This compiles a
small model (matmul + flex attention, forward and backward) with torch.compile on CUDA into
fresh TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR directories, saves the mega-cache
artifacts like the trainer's warm-up, then lists the cache the way dfo does
(``orchestrator/remote/cache_tool.hash_dir``), tars it like ``dfo warm-cache`` (GNU tar)
and checks the tar with dfo's member check (``scan_tar``) and its own extractor
(``unpack``).

    python3 bench/check_cache_members.py          # writes $OUT/cache_members.json

Needs torch with CUDA; no network. Exits 1 when the cache holds anything dfo would refuse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.remote import cache_tool  # noqa: E402  (stdlib only)

COMPILE = r"""
import json, torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
dev = "cuda" if torch.cuda.is_available() else "cpu"
def causal(b, h, q, kv):
    return q >= kv
def f(x, w, q, k, v, bm):
    y = torch.nn.functional.gelu(x @ w).sum()
    o = flex_attention(q, k, v, block_mask=bm)
    return y + o.float().sum()
x = torch.randn(64, 128, device=dev, requires_grad=True)
w = torch.randn(128, 128, device=dev, requires_grad=True)
q, k, v = (torch.randn(1, 4, 256, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
bm = create_block_mask(causal, 1, 1, 256, 256, device=dev)
torch.compile(f)(x, w, q, k, v, bm).backward()
art = torch.compiler.save_cache_artifacts()
import os
os.makedirs(os.environ["MEGA_DIR"], exist_ok=True)
if art is not None:
    open(os.path.join(os.environ["MEGA_DIR"], "artifacts.bin"), "wb").write(art[0])
print(json.dumps({"torch": torch.__version__, "device": dev,
                  "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None}))
"""


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dfo-members-"))
    gen = work / "gen"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(gen / "inductor"),
               TRITON_CACHE_DIR=str(gen / "triton"), MEGA_DIR=str(gen / "mega"))
    r = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True,
                       timeout=900)
    result: dict = {"compile_rc": r.returncode, "stderr_tail": r.stderr[-3000:]}
    if r.returncode == 0:
        result.update(json.loads(r.stdout.strip().splitlines()[-1]))
        for sub in ("inductor", "triton", "mega"):
            (gen / sub).mkdir(parents=True, exist_ok=True)
        listing = cache_tool.hash_dir(str(gen))
        result["files"] = len(listing["files"])
        result["bytes"] = sum(v["size"] for v in listing["files"].values())
        result["other"] = listing["other"]  # what dfo would refuse to snapshot
        tar = work / "snap.tar"
        subprocess.run(["tar", "-cf", str(tar), "-C", str(gen), "--", "inductor", "triton", "mega"],
                       check=True)
        result["scan"] = cache_tool.scan_tar(str(tar))
        dest = work / "restored"
        dest.mkdir()
        back = cache_tool.unpack(str(tar), str(dest))
        result["unpack_refused"] = back.get("refused")
        result["unpack_same_files"] = back.get("files") == listing["files"]
    ok = (r.returncode == 0 and not result.get("other") and "refused" not in result.get("scan", {})
          and not result.get("unpack_refused") and result.get("unpack_same_files"))
    result["ok"] = bool(ok)
    (out_dir / "cache_members.json").write_text(json.dumps(result, indent=1))
    print("BENCH " + json.dumps({k: v for k, v in result.items() if k != "stderr_tail"}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
