"""The work of each dfo command (deploy, cache, runs, logs, demo, wheel, hostcheck,
diagnose): sequences pure decisions from ``orchestrator.plan`` and ``orchestrator.common``
and calls through a ``orchestrator.transport.Transport``. Imports plan, common, transport,
config and dfo_contract; never click or rich."""
