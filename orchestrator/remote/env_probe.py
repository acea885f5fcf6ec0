"""The env probe: what an env's interpreter has (python, torch, GPUs, transformers, trainer).

Runs *inside* the env being verified as ``<env>/bin/python -c SOURCE`` (its source is the
script text: the env's dfo wheel is not trusted yet), so it stays stdlib-only and
self-contained. Prints one line ``@dfo-probe {json}``; ``orchestrator.ops.fingerprint``
parses it. A module that fails to import is recorded in ``errors``, never raised.
"""

import json
import platform
import sys

MARK = "@dfo-probe "


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
