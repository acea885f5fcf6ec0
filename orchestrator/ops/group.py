"""One run across several nodes (``dfo launch --group NAME``): what each node's supervisor
is told (``GroupSpec``, the ``group`` section of its ``spec.json``) and the names of the keys
the node supervisors share in the coordination store. Pure: no I/O.

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

from dataclasses import dataclass, field
from typing import Any, Mapping

#: seconds without a heartbeat before the head declares a node lost
NODE_LOST_S = 20.0


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    name: str                      # the group's name in hosts.yaml
    nodes: tuple[str, ...]         # host names, the head (node 0) first
    node: int                      # this node's index into ``nodes``
    head_addr: str                 # where the other nodes reach the head
    port: int                      # torchrun's c10d rendezvous (--rdzv-endpoint head_addr:port)
    coord_port: int                # the supervisors' TCPStore on the head
    nproc: int                     # processes on this node (--nproc-per-node)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # this node's extra env
    node_lost_s: float = NODE_LOST_S

    @property
    def is_head(self) -> bool:
        return self.node == 0

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def host(self) -> str:
        return self.nodes[self.node]

    def rdzv_id(self, run_id: str, attempt: int) -> str:
        """A fresh rendezvous per attempt: a restarted attempt never meets a stale round."""
        return f"{run_id}-a{attempt}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": list(self.nodes), "node": self.node,
                "head_addr": self.head_addr, "port": self.port, "coord_port": self.coord_port,
                "nproc": self.nproc, "env": dict(self.env), "node_lost_s": self.node_lost_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GroupSpec":
        return cls(name=str(d["name"]), nodes=tuple(d["nodes"]), node=int(d["node"]),
                   head_addr=str(d["head_addr"]), port=int(d["port"]),
                   coord_port=int(d["coord_port"]), nproc=int(d["nproc"]),
                   env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
                   node_lost_s=float(d.get("node_lost_s", NODE_LOST_S)))


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


def key_decision(attempt: int) -> str:
    """JSON the head sets after attempt N: restart (with what) or final (status, reason)."""
    return f"decision/{attempt}"


KEY_STOP = "stop"  # set by any node that got ``dfo stop``: every node stops (one checkpoint)
