"""The bundled DFlash drafter trainer (block-diffusion speculative decoding).

``python -m trainer train|warmup ...``; see docs/trainer.md and docs/contracts.md.
Its parts, lowest first; each imports only those before it (tests/test_import_graph.py):
``env`` (the environment, read once), ``model`` (drafter, target: architecture only),
``compile`` (torch.compile, the compile gate, compiling a target's layers from outside),
``data`` (records to micro-batches), ``telemetry`` (events, TensorBoard, fault injection),
``core`` (one step, the objectives, checkpoints), ``parallel`` (layouts), ``evaluate``
(acceptance, speculative decoding, export), ``train`` (the loop and the warm-up: the entry
points), ``bench``; ``preload`` and ``__main__`` on top. This package's ``__init__``
imports no torch. The trainer never imports the orchestrator:
what both sides agree on (config tree, exit codes, checkpoint manifests, markers, fault
spec) is the torch-free ``dfo_contract`` package.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
