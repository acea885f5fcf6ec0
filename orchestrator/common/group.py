"""One run across several nodes (``dfo launch --group NAME``): what each node's supervisor
is told (``GroupSpec``: ``dfo_contract.runspec.Group``, the ``role`` of its ``spec.json``).
The keys and messages the node supervisors share in the coordination store are
``dfo_contract.group_store``. Pure.

Every node has its own run dir ``<its root>/runs/<RUN_ID>/`` (same run id everywhere) with
its own spec.json, state.json, events.jsonl and attempt logs. Node 0 (the head) holds the
checkpoints (the trainer's main rank runs there: ``DFO_NODE_RANK=0``, local rank 0) and
decides for the whole run: one fallback and one checkpoint per restart, one budget.

The node supervisors coordinate through ``torch.distributed.TCPStore``: the head's supervisor
hosts it on ``head_addr:coord_port`` (``port + 1``; torchrun's own c10d rendezvous store is on
``port`` and lives only as long as one attempt's torchrun, so it cannot carry decisions
between attempts), the others connect to it. The user's laptop is not involved: a run keeps
recovering while it is offline.
"""

from __future__ import annotations

from dfo_contract.runspec import NODE_LOST_S  # noqa: F401  (the head's lost-node limit)
from dfo_contract.runspec import Group as GroupSpec  # noqa: F401  (spec.json's role of a node)

