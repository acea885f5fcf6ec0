"""The entry points of a run: the training loop (``loop``, ``python -m trainer train``) and
the compile warm-up (``warmup``, ``python -m trainer warmup``).

Importing the package imports none of its modules (and no torch).
"""
