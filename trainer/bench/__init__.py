"""``python -m trainer.bench``: the GPU benchmark of one drafter training step.

Importing the package imports none of its modules (and no torch).
"""
