"""Training: the loop, one step's building blocks, the objective, checkpoints, metrics and
TensorBoard events, fault injection.

Importing the package imports none of its modules (and no torch).
"""
