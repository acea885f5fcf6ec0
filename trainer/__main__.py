"""``python -m trainer train|warmup|export|eval ...`` (docs/contracts.md, "The trainer's command line").

    python -m trainer train  --config FILE.yaml [--SECTION.FIELD VALUE ...] [--resume step_N|latest|PATH]
    python -m trainer warmup --config FILE.yaml [--SECTION.FIELD VALUE ...] [--report FILE.json]
    python -m trainer export CHECKPOINT --out DIR [--dtype bf16] [--target DIR]
    python -m trainer eval   CHECKPOINT|EXPORT --prompts FILE [--spec-decode N] [--target DIR]

Exit codes: dfo_contract/exitcodes.py (0 done, 2 config, 3 data, 4 checkpoint, 5 fatal,
6 interrupted). User errors print one line; fatal errors print the traceback too.
"""

from __future__ import annotations

import logging
import sys
import traceback

from dfo_contract.trainer_config import split_args  # torch-free; re-exported for callers of trainer.__main__
from dfo_contract.exitcodes import CONFIG_ERROR, FATAL, TABLE, exit_code_for

USAGE = ("usage: python -m trainer train --config FILE.yaml [--SECTION.FIELD VALUE ...] "
         "[--resume step_N|latest|PATH]\n"
         "       python -m trainer warmup --config FILE.yaml [--SECTION.FIELD VALUE ...] "
         "[--report FILE.json]\n"
         "       python -m trainer export CHECKPOINT --out DIR [--dtype bf16] [--target DIR]\n"
         "       python -m trainer eval CHECKPOINT|EXPORT --prompts FILE [--spec-decode N] "
         "[--target DIR]")


def _usage(msg: str):
    from dfo_contract.exitcodes import TrainerConfigError

    return TrainerConfigError(f"config: {msg}")


def _setup_logging() -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    lg = logging.getLogger("dfo")
    lg.addHandler(h)
    lg.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        print("exit codes: " + "; ".join(f"{k} {v}" for k, v in TABLE.items()))
        return 0 if argv else CONFIG_ERROR
    cmd, rest = argv[0], argv[1:]
    _setup_logging()
    try:
        if cmd == "train":
            from dfo_contract.trainer_config import load_config

            config, opts, overrides = split_args(rest, ("--resume",))
            cfg = load_config(config, overrides)
            from .train.loop import train  # torch is imported from here on

            return train(cfg, resume=opts.get("--resume"))
        if cmd == "warmup":
            from .train import compile_only

            return compile_only.main(rest)
        if cmd == "export":
            from .evaluate import export_dir

            return export_dir.main(rest)
        if cmd == "eval":
            from .evaluate import spec_eval

            return spec_eval.main(rest)
        raise _usage(f"unknown command {cmd!r} (expected train, warmup, export or eval)")
    except Exception as e:  # noqa: BLE001 - this is the one place errors become exit codes
        code = exit_code_for(e)
        if code == FATAL:
            traceback.print_exc()
            print(f"trainer: fatal: {e.__class__.__name__}: {e}", file=sys.stderr, flush=True)
        else:
            print(f"trainer: {e}", file=sys.stderr, flush=True)
        return code


def exit_now(code: int) -> None:
    """End the process with ``code`` once its output is flushed, skipping interpreter teardown.

    By the time ``train`` returns, its ``finally`` has stopped the threads and every file the
    run writes is flushed per record. What teardown would still do -- collect CUDA and the
    compile workers' pool, join non-daemon threads of the libraries -- took 2 s on CPU and
    3.8 s on an H200 after torch's FX error (bench/results/h200-20261201-speed), all of it on a
    recovery's critical path (the supervisor waits for the exit). The compile workers see their
    pipe close and exit by themselves.
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    _code = main()
    if sys.argv[1:2] == ["train"]:
        exit_now(_code)
    sys.exit(_code)
