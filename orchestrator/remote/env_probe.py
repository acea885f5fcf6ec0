"""The env probe: what an env's interpreter has (python, torch, GPUs, transformers, trainer).

Runs *inside* the env being verified as ``<env>/bin/python -c SOURCE`` (its source is the
script text: the env's dfo wheel is not trusted yet), so it stays stdlib-only and
self-contained. Prints one line ``@dfo-probe {json}``, the shape of
``dfo_contract.env_fingerprint.EnvFingerprint`` without ``profile`` and ``lock_hash``, written
here by hand; ``orchestrator.plan.fingerprint.parse_probe`` reads it into that record. A module
that fails to import is recorded in ``errors``, never raised.
"""

import json
import os
import platform
import sys

MARK = "@dfo-probe "

# what the env has, not the directory the probe was started in: ``-c`` puts "" (the working
# directory) first on sys.path, and a dfo checkout there would answer for dfo and trainer
sys.path[:] = [p for p in sys.path if p != ""]


def _err(e: BaseException) -> str:
    return "%s: %s" % (type(e).__name__, e)


def _torch(fp: dict) -> None:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a fact to report
        fp["torch"] = None
        fp["errors"]["torch"] = _err(e)
        return
    try:
        fp["torch"] = str(torch.__version__)
        fp["torch_git"] = getattr(torch.version, "git_version", None)
        fp["torch_cuda"] = torch.version.cuda
        fp["cuda_available"] = bool(torch.cuda.is_available())
        n = torch.cuda.device_count() if fp["cuda_available"] else 0
        fp["device_count"] = n
        fp["devices"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                          "capability": "%d.%d" % tuple(torch.cuda.get_device_capability(i))}
                         for i in range(n)]
    except Exception as e:  # noqa: BLE001
        fp["torch"] = None
        fp["errors"]["torch"] = _err(e)


def _gpu_smoke(fp: dict) -> None:
    """Compile flex_attention forward and backward on a tiny shape on cuda:0: catches
    driver, Triton and compiler problems before a run spends hours. "ok", or the error.
    None without CUDA; DFO_PROBE_SMOKE=0 skips it ("skipped")."""
    if not fp.get("cuda_available"):
        fp["gpu_smoke"] = None
        return
    if os.environ.get("DFO_PROBE_SMOKE") == "0":
        fp["gpu_smoke"] = "skipped"
        return
    try:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        fn = torch.compile(flex_attention, dynamic=False)
        q, k, v = (torch.randn(1, 2, 128, 64, device="cuda:0", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        out = fn(q, k, v)
        out.float().sum().backward()
        torch.cuda.synchronize()
        finite = bool(torch.isfinite(out).all()) and all(
            t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
        fp["gpu_smoke"] = "ok" if finite else "flex_attention gave non-finite values"
    except Exception as e:  # noqa: BLE001 - the failure is the fact to report
        fp["gpu_smoke"] = _err(e)[:500]
        fp["errors"]["gpu_smoke"] = fp["gpu_smoke"]


def _version_of(fp: dict, field: str, module: str, *, record: bool) -> None:
    try:
        mod = __import__(module)
        fp[field] = getattr(mod, "__version__", None)
    except Exception as e:  # noqa: BLE001
        fp[field] = None
        if record:
            fp["errors"][module] = _err(e)


def probe() -> dict:
    """The probe's facts (the fields of fingerprint.json that the env decides)."""
    fp: dict = {"python": platform.python_version(), "errors": {}}
    try:
        import importlib.metadata as md
        fp["dfo"] = md.version("dfo")
    except Exception:  # noqa: BLE001
        fp["dfo"] = None
    _torch(fp)
    _gpu_smoke(fp)
    _version_of(fp, "triton", "triton", record=False)
    _version_of(fp, "transformers", "transformers", record=True)
    try:
        import trainer  # noqa: F401
        fp["trainer_import"] = True
    except Exception as e:  # noqa: BLE001
        fp["trainer_import"] = False
        fp["errors"]["trainer"] = _err(e)
    return fp


def main() -> int:
    sys.stdout.write(MARK + json.dumps(probe()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
