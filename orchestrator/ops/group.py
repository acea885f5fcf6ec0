"""One run across several nodes (``dfo launch --group NAME``): what each node's supervisor
is told (``GroupSpec``: ``dfo_contract.runspec.Group``, the ``role`` of its ``spec.json``)
and the names of the keys the node supervisors share in the coordination store. Pure.

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


# --- coordination store keys (all under the run's prefix) ------------------------------------

def key_prefix(run_id: str) -> str:
    return f"dfo/{run_id}/"


def key_heartbeat(node: int) -> str:
    """A counter each node's supervisor increments (``store.add``) every second; the head
    watches it change by its own clock (node clocks may differ)."""
    return f"hb/{node}"


def key_plan(attempt: int) -> str:
    """JSON the head sets before attempt N: overrides, resume path (on the head), rdzv id."""
    return f"plan/{attempt}"


def key_abort(attempt: int) -> str:
    """Set by the first node whose attempt N ended or was judged failed: the others stop theirs."""
    return f"abort/{attempt}"


def key_end(attempt: int, node: int) -> str:
    """JSON each node sets when its part of attempt N ended: its own classification."""
    return f"end/{attempt}/{node}"


def key_stopped(attempt: int, node: int) -> str:
    """JSON a node sets when the stopped processes (state T) of its part of attempt N change:
    ``{"pids": [...]}`` (empty: none now). The head reads its peers' before it judges a hang."""
    return f"stopped/{attempt}/{node}"


def key_decision(attempt: int) -> str:
    """JSON the head sets after attempt N: restart (with what) or final (status, reason)."""
    return f"decision/{attempt}"


KEY_STOP = "stop"  # set by any node that got ``dfo stop``: every node stops (one checkpoint)
