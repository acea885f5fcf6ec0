"""The work of each dfo command (deploy, cache, runs, logs, demo, wheel, hostcheck,
diagnose): sequences pure decisions from ``orchestrator.ops`` and calls through a
``orchestrator.transport.Transport``. Imports ops, transport, config and dfo_contract;
never click or rich."""
