"""The bundled DFlash drafter trainer (block-diffusion speculative decoding).

``python -m trainer train|warmup ...``; see docs/trainer.md and docs/contracts.md.
Packages: ``data`` (records to micro-batches), ``model`` (drafter, target), ``compile``
(torch.compile, the compile gate, warm-up), ``train`` (loop, step, objective,
checkpoints, metrics), ``parallel`` (layouts), ``evaluate`` (acceptance, speculative
decoding, export), ``bench``. This package's ``__init__`` imports no torch. The trainer never imports the orchestrator:
what both sides agree on (config tree, exit codes, checkpoint manifests, markers, fault
spec) is the torch-free ``dfo_contract`` package.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
