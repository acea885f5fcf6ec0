"""The part both programs run: the laptop's ``dfo`` and the container's supervisor.

Pure and small: errors, the failure classifier and its rules, the fallback ladders and the
verdict, budgets, your own trainer's steps, the trainer's argv and env, the group's spec,
goodput, the metrics sparkline, the GPUs' compute processes. No I/O; imports nothing of
the orchestrator outside this package (``dfo_contract`` and the stdlib only).
"""
