"""The classifier's table: the rules (regexes tried on each output line) that give a line
its class, and the failure classes and their order when several have evidence (derived from
``dfo_contract.failure_classes``, where each class is one row).

Pure data; :mod:`orchestrator.common.classify` applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dfo_contract import exitcodes
from dfo_contract.failure_classes import TABLES

CLASSES = TABLES.classes

#: when several classes have evidence, the first in this order wins
PRIORITY = TABLES.priority

#: classes that no restart can help: the run stops at once and the reason says what to fix
PERMANENT_CLASSES = TABLES.permanent

#: classes only a multi-node run's node ends carry (``supervisor.policy.group_decide``); not in CLASSES, so
#: no ladder or budget names them: ``node_lost`` gives up at once (the fix is in the reason),
#: ``peer_abort`` (this node stopped because another node's attempt failed) is never the
#: run's root cause while any node has a real class
PEER_ABORT = "peer_abort"
NODE_LOST = "node_lost"
GROUP_CLASSES = (PEER_ABORT, NODE_LOST)

#: trainer exit codes (dfo_contract.exitcodes) that mean "restarting cannot help"
PERMANENT_EXITS = {exitcodes.CONFIG_ERROR: "config error", exitcodes.DATA_ERROR: "data error",
                   exitcodes.CHECKPOINT_ERROR: "checkpoint error"}
EXIT_DONE = exitcodes.DONE
EXIT_INTERRUPTED = exitcodes.INTERRUPTED


@dataclass(frozen=True)
class Rule:
    cls: str
    name: str
    pattern: re.Pattern
    #: True: seeing this line while the attempt runs is enough to act on (kill + fallback)
    live: bool = True


def _r(cls: str, name: str, rx: str, *, live: bool = True) -> Rule:
    return Rule(cls, name, re.compile(rx), live)


RULES: tuple[Rule, ...] = (
    # the trainer's own line for a checkpoint that did not fit (trainer.core.diskfull): it
    # names the filesystem, what is free and what the checkpoint needs
    _r("disk_full", "trainer-disk-full", r"\bdisk full: the filesystem at ", live=False),
    # ENOSPC / EDQUOT anywhere else (a metrics file, a log, a compile cache); not acted on
    # while the attempt runs (a cache write that failed is a warning): its end decides
    _r("disk_full", "no-space-left", r"No space left on device|Disk quota exceeded",
       live=False),
    # EROFS: a checkpoint (or anything else) written to a read-only filesystem; permanent
    _r("read_only", "read-only-filesystem", r"\[Errno 30\] Read-only file system",
       live=False),
    # torch/_dynamo/eval_frame.py compile_wrapper, in any thread's traceback
    _r("fx_trace_race", "fx-symbolic-trace-of-dynamo-fn",
       r"Detected that you are using FX to symbolically trace a dynamo-optimized function"),
    # triton/runtime/errors.py OutOfResources (shared memory of one kernel config), raised
    # while inductor benchmarks or runs a template kernel (flex attention's backward with a
    # large head dim on Hopper): the same kernel fails the same way every time. Before the
    # oom rules: newer triton words it `OutOfMemoryError: out of resource: ...`
    # inductor's autotuner skipping one config that does not fit ("No valid triton configs.
    # ... out of resource ... Ignoring this choice"): weak evidence (WEAK_RULES), a class only
    # when a compile also failed; a run whose autotuning found another config goes on
    _r("compile_resources", "autotune-out-of-resources",
       r"No valid triton configs\..{0,80}out of resource", live=False),
    _r("compile_resources", "triton-out-of-resources",
       r"OutOfResources|out of resource: \S+.{0,40}Required: \d+", live=False),
    # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError / CUDA's own wording
    _r("oom", "torch-oom-error", r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b"),
    _r("oom", "cuda-out-of-memory", r"CUDA out of memory|CUDA error: out of memory"),
    # concurrent.futures.process.BrokenProcessPool from inductor's compile workers
    # (torch/_inductor/async_compile.py, compile_worker/subproc_pool.py)
    _r("compile_workers", "compile-pool-broken",
       r"BrokenProcessPool|A process in the process pool was terminated abruptly|"
       r"SubprocException|compile_worker.{0,80}(?:died|terminated|crashed)|"
       # torch 2.13's own wording of it (async_compile.py AsyncCompile.wait)
       r"A compilation subprocess exited unexpectedly|"
       r"Inductor compile-worker future for .{0,200} did not complete within", live=False),
    # the watchdog's timeout of a rank's FIRST collective (SeqNum=1, nothing completed yet):
    # the ranks never met once, which is compile skew at warm-up (one rank still compiling
    # while the other waits in the first all-reduce), not a flaky link
    _r("warmup_collective", "first-collective-timeout",
       r"WorkNCCL\(SeqNum=1,.{0,200}(?:Timeout\(ms\)=|timed out|timing out)|"
       r"last completed NCCL work: -1\b"),
    # c10d ProcessGroupNCCL watchdog
    _r("nccl_timeout", "nccl-watchdog-timeout", r"Watchdog caught collective operation timeout"),
    _r("nccl_timeout", "nccl-watchdog-terminated",
       r"[Pp]rocess group watchdog thread terminated with exception"),
    _r("nccl_timeout", "collective-timeout",
       r"NCCL(?:Work|\b).{0,60}(?:timed out|Timeout\(ms\)=)|DistBackendError.*[Tt]imeout"),
    _r("nan_loss", "nan-loss-text",
       r"(?i)\b(?:non-finite|nan|inf) loss\b|\bloss(?: is|=|:)\s*(?:nan|-?inf)\b"),
    # torch/nn/attention/flex_attention.py: the unfused (dense) path
    _r("dense_fallback", "flex-dense-warning", r"materializes the full scores matrix"),
    # torch/_dynamo/convert_frame.py: recompile limit -> runs eager from then on
    _r("dense_fallback", "recompile-limit", r"hit config\.recompile_limit|recompile_limit \(\d+\)"),
    # a compile that failed for any other reason: torch._inductor.exc.InductorError,
    # torch._dynamo.exc.BackendCompilerFailed (the exception line of the traceback)
    _r("compile_error", "inductor-error",
       r"\bInductorError: |\bBackendCompilerFailed: ", live=False),
)

#: rules whose lines alone make no class: only beside a failed compile (``compile_error``)
WEAK_RULES = frozenset({"autotune-out-of-resources"})
