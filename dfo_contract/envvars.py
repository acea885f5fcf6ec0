"""Names of the environment variables the supervisor sets for an attempt.

The supervisor writes them (``orchestrator.plan.launch_plan.attempt_env``); the trainer
reads them in one place (``trainer.env``). Nobody else spells these names.
"""

ATTEMPT = "DFO_ATTEMPT"          # 1-based attempt number
RUN_DIR = "DFO_RUN_DIR"          # <root>/runs/<run-id>
RUN_ID = "DFO_RUN_ID"            # the run's id (checkpoint lineage)
CACHE_KEY = "DFO_CACHE_KEY"      # the compile-cache key in force
CACHE_DIR = "DFO_CACHE_DIR"      # the run's compile-cache directory
NODE_RANK = "DFO_NODE_RANK"    # multi-node run: this node's index ("0" = the head, which writes)
FAULT = "DFO_FAULT"              # fault-injection spec (tests, the demo)
SPAWN_T = "DFO_SPAWN_T"          # epoch seconds when the supervisor started (or handed off) the attempt
HOSTS = "DFO_HOSTS"              # test lab: hosts.yaml override
PROJECT_WHEEL = "DFO_PROJECT_WHEEL"  # a prebuilt project wheel to deploy
