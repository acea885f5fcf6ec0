"""The entry points of a run: training (``loop``, ``python -m trainer train``, which runs a
``run.TrainingRun``) and the compile warm-up without training (``compile_only``,
``python -m trainer warmup``).

Importing the package imports none of its modules (and no torch).
"""
