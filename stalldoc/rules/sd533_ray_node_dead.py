"""SD533 ray-node-dead."""
from __future__ import annotations

import re
from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature

_HEARTBEATS = (r"has been marked dead because the (?:detector|monitor) has missed too many "
               r"heartbeats")
_ACTOR_NODE = r"The actor (?:is dead|died) because its node has died\. Node Id: (?P<node_id>\w+)"
_RAYLET = (r"Raylet is terminated(?:: ip=(?P<address>[^,\s]+), id=(?P<node_id>\w+))?\. "
           r"Termination is unexpected")
_MARKED = (r"Exiting because this node manager has mistakenly been marked (?:as )?dead by the "
           r"(?:GCS|monitor)(?:: (?P<reason>[^.\"]+))?")
_KIND = {_HEARTBEATS: "heartbeats", _ACTOR_NODE: "actor_node", _RAYLET: "raylet_terminated",
         _MARKED: "marked_dead"}
# the node the GCS's heartbeat line names: old (client ID), plain, and the JSON event's form
_NODE_ID = re.compile(r"(?:node id:|client ID|\"node_id\":\")\s*([0-9a-f]{16,})")
_ADDRESS = re.compile(r"\b(?:ip|address): ([\w.:-]+)")
_NODE_NAME = re.compile(r"node name: ([\w.:-]+)")
_LOST = "every actor and task on it is lost, and whatever waits on them waits"
_WHY = {
    "heartbeats": "the GCS missed too many of its heartbeats (its raylet crashed or was killed, "
                  "or the node or the network was too slow to answer)",
    "actor_node": "an actor died with it",
    "raylet_terminated": "its raylet was terminated unexpectedly (SIGKILL, often the OOM killer, "
                         "or a crash)",
    "marked_dead": "the GCS marked it dead and its raylet exits",
}


class RayNodeDead(LogSignature):
    """A node of the Ray cluster is dead: the GCS missed its heartbeats, or its raylet ended.

    What it does
        Matches the GCS's ``The node with node id: ... and address: ... and node name: ... has
        been marked dead because the detector has missed too many heartbeats from it`` (older:
        ``and ip: ...``; Ray <= 0.6: ``The node with client ID ... because the monitor has missed
        too many heartbeats``; also as a ``RAY_NODE_REMOVED`` event), the raylet's own ``Exiting
        because this node manager has mistakenly been marked as dead by the GCS``, ``Raylet is
        terminated: ip=..., id=.... Termination is unexpected``, and an actor's ``The actor is
        dead because its node has died. Node Id: ...``.

    Why is this bad?
        A dead node takes every actor and task on it along: in an RL job that is a rollout engine,
        a trainer rank or the reward model, and the driver waits on it (a collective, a
        ``ray.get``) until it fails or hangs. The raylet may have been killed (the OOM killer) or
        only been slow: the GCS marks a node dead after a few failed health checks either way.

    Evidence
        the lines; ``node_id``, ``address`` and ``node_name`` of the dead node; ``kind``
        (heartbeats, actor_node, raylet_terminated, marked_dead); ``reason`` where the raylet
        gives one.

    Fix
        Read the dead node's own logs: ``/tmp/ray/session_latest/logs/raylet.out`` (``raylet.err``)
        and its kernel log (``dmesg``: the OOM killer, NIC or GPU errors). A node that was only
        slow (a loaded CPU, a busy network) is marked dead falsely: raise the GCS's health-check
        limits (``RAY_health_check_timeout_ms``, ``RAY_health_check_failure_threshold``) when
        starting Ray.

        ``RAY_health_check_period_ms`` and ``RAY_health_check_initial_delay_ms`` set how often
        and how soon the GCS checks; older Ray counted heartbeats instead
        (``num_heartbeats_timeout``).

    References
        ray-project/ray#15128 (``and ip:``), ray-project/ray#18449 (as the driver prints it),
        ray-project/ray#44680 (``and address: ... and node name:``), ray-project/ray#54035 (the
        ``RAY_NODE_REMOVED`` event), ray-project/ray#3446 (``client ID``, the monitor),
        vllm-project/vllm#19960 (the raylet's own ``RAYLET_MARKED_DEAD`` event),
        ray-project/ray#34971 (an actor's node died), ray-project/ray#29412,
        ray-project/ray#31261, verl-project/verl#6645 and ray-project/ray#45041 (the raylet
        terminated).
    """

    code = "SD533"
    name = "ray-node-dead"
    severity = Severity.CRITICAL
    headline = "A Ray node is dead"
    patterns = (_HEARTBEATS, _ACTOR_NODE, _RAYLET, _MARKED)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        """The line's groups, its kind, and the node the GCS's line names (id, address, name)."""
        figures = {"kind": _KIND[match.re.pattern], **super().details(match)}
        for key, found in (("node_id", _NODE_ID), ("address", _ADDRESS),
                           ("node_name", _NODE_NAME)):
            if key not in figures and (hit := found.search(match.string)):
                figures[key] = hit.group(1)
        return figures

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            evidence = dict(found.evidence)
            yield self.finding(found.ranks, _summary(evidence), evidence)


def _summary(evidence: dict[str, Any]) -> str:
    why = _WHY[evidence["kind"]]
    if reason := evidence.get("reason"):
        why = f"{why} ({reason})"
    return f"{_node(evidence)} is dead: {why}; {_LOST}"


def _node(evidence: dict[str, Any]) -> str:
    address, node_id = evidence.get("address"), evidence.get("node_id")
    if address and node_id:
        return f"Ray node {address} ({node_id})"
    return f"Ray node {address or node_id}" if address or node_id else "A Ray node"
