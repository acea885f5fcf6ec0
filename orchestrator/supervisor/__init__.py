"""The remote side's supervisor: runs inside the container from the deployed env.

``python -m orchestrator.supervisor --run-dir DIR`` supervises one run (``DIR/spec.json``).
``python -m orchestrator.supervisor.follow`` streams a run's files by byte offset for
``dfo logs``; ``python -m orchestrator.supervisor.query`` reports runs for ``dfo status``.
Nothing here imports torch.
"""
