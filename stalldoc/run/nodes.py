"""Which node of a multi-node job this watcher is: its index and the number of nodes, from the
launcher's arguments or the environment, else the host name.

One ``stalldoc watch`` runs per node; given the same ``--run-dir`` (a shared filesystem path),
each writes its own node subdirectory, named here: ``node-<index>`` when the node rank is known
(``torchrun --node_rank``, ``accelerate --machine_rank``, ``NODE_RANK`` as swift reads it, Slurm's
``SLURM_NODEID``), else ``node-<host>`` (an elastic rendezvous gives node ranks only at run time).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from stalldoc.launch.config import launcher_options

NODE_RANK_FLAGS = ("--node_rank", "--node-rank", "--machine_rank", "--machine-rank")
NNODES_FLAGS = ("--nnodes", "--num_nodes", "--num-nodes", "--num_machines", "--num-machines")
NODE_RANK_ENV = ("NODE_RANK", "PET_NODE_RANK", "SLURM_NODEID")
NNODES_ENV = ("NNODES", "PET_NNODES", "SLURM_NNODES")
MAX_NODES = 100_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class NodeIdentity:
    """This node: its subdirectory's name, its index (None: unknown) and the node count."""

    name: str
    index: int | None
    count: int | None

    @property
    def multi(self) -> bool:
        """The job spans nodes (more than one, or this is not the first)."""
        return (self.count or 1) > 1 or (self.index or 0) > 0

    @property
    def label(self) -> str:
        """How messages name it: 'node 1', or 'node gpu-07' by host."""
        return f"node {self.index}" if self.index is not None else self.name.replace("-", " ", 1)


def node_identity(argv: Sequence[str], env: Mapping[str, str], host: str) -> NodeIdentity:
    """This node, as the command and the environment say (the launcher's flags win)."""
    opts = launcher_options(argv)
    index = _whole(_first(opts, NODE_RANK_FLAGS) or _first(env, NODE_RANK_ENV), 0)
    count = _count(_first(opts, NNODES_FLAGS) or _first(env, NNODES_ENV))
    if index is not None and count is not None and index >= count:
        index = None    # not a node rank of this job: name the node by host
    name = f"node-{index}" if index is not None else f"node-{_safe(host)}"
    return NodeIdentity(name, index, count)


def _first(values: Mapping[str, str], keys: Sequence[str]) -> str | None:
    return next((values[k] for k in keys if values.get(k)), None)


def _whole(text: str | None, low: int) -> int | None:
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if low <= value < MAX_NODES else None


def _count(text: str | None) -> int | None:
    """A node count: N, or the most of an elastic MIN:MAX."""
    return _whole((text or "").rpartition(":")[2], 1)


def _safe(host: str) -> str:
    """A host name as a directory name: nothing but letters, digits, dot, dash, underscore."""
    return _UNSAFE.sub("_", host)[:64] or "unknown"
