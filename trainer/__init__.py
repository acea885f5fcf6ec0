"""The bundled DFlash drafter trainer (block-diffusion speculative decoding).

``python -m trainer train|warmup ...``; see docs/trainer.md and docs/contracts.md.
This package's ``__init__`` imports no torch. The trainer never imports the orchestrator:
what both sides agree on (config tree, exit codes, checkpoint manifests, markers, fault
spec) is the torch-free ``dfo_contract`` package.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
