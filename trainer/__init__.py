"""The bundled DFlash drafter trainer (block-diffusion speculative decoding).

``python -m trainer train|warmup ...``; see docs/trainer.md and docs/contracts.md.
This package's ``__init__`` imports no torch: ``trainer.config``, ``trainer.exitcodes``
and ``trainer.ckpt_manifest`` are torch-free so the orchestrator may import them.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
