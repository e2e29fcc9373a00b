"""SD534 ray-unschedulable."""
from __future__ import annotations

import re
from typing import Any, Iterator

from stalldoc.detect.cluster_wait import INFEASIBLE_REQUEST
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature, matching_lines

_DICT = r"\{[^{}]*\}"
_CLAIMED = (r"The following resource request cannot be scheduled right now: (?P<request>" + _DICT
            + ")")
_INFEASIBLE = INFEASIBLE_REQUEST   # the line the watcher also reads as a wait for the cluster
_OLD_CLAIMED = r"The actor or task with ID (?P<task_id>\w+) cannot be scheduled right now"
_REQUIRED = r"Required resources for this actor or task: (?P<request>" + _DICT + ")"
_NO_NODES = (r"Failed to schedule placement group (?P<placement_group>[^,\s]+), id: "
             r"(?P<placement_group_id>\w+), because no nodes are available")
_VLLM_WAIT = (r"Waiting for creating a placement group of specs for (?P<waited_seconds>\d+) "
              r"seconds\. specs=(?P<request>\[[^\]]*\])")
_PENDING = (r"(?P<request>" + _DICT + r")(?: \* (?P<bundles>\d+) \((?P<strategy>[A-Z_]+)\))?: "
            r"\d+\+ pending (?P<pending>placement groups|tasks/actors)")
_KIND = {_CLAIMED: "claimed", _INFEASIBLE: "infeasible", _OLD_CLAIMED: "claimed",
         _REQUIRED: "claimed", _NO_NODES: "no_nodes", _VLLM_WAIT: "waiting", _PENDING: "pending"}
_WHY = {
    "claimed": "what it asks for is held (by other actors, tasks or placement groups)",
    "infeasible": "no node type of this cluster can hold it",
    "no_nodes": "no node has room for its bundles",
    "waiting": "vLLM has waited {waited_seconds} s for its placement group",
    "pending": "`ray status` lists it among the pending demands",
}
_WAITS = "whatever waits for it (an actor, a placement group, a ray.get) waits"


class RayUnschedulable(LogSignature):
    """Ray cannot place a resource request: the actor, task or placement group waits for good.

    What it does
        Matches Ray's ``Warning: The following resource request cannot be scheduled right now:
        {...}. This is likely due to all cluster resources being claimed by actors`` (older: ``The
        actor or task with ID ... cannot be scheduled right now`` with ``Required resources for
        this actor or task: {...}``), the autoscaler's ``Error: No available node types can
        fulfill resource request {...}``, the GCS's ``Failed to schedule placement group ...
        because no nodes are available``, vLLM's ``Waiting for creating a placement group of
        specs for N seconds. specs=[...]``, and the pending demands ``ray status`` prints (``{...}
        * 8 (STRICT_PACK): 1+ pending placement groups``, ``{...}: 1+ pending tasks/actors``).
        An error; a warning where only a pending demand of ``ray status`` was seen (it may still
        be placed).

    Why is this bad?
        Ray never fails a request it cannot place: the actor stays pending, ``ray.get`` or
        ``placement_group.ready()`` waits, and the job idles without an error, GPUs free or held
        by a previous run. In RL jobs it is the sum of the roles' GPUs (actor, rollout, reference,
        critic, reward; a tensor-parallel rollout's bundles in one node) that does not fit.

    Evidence
        the lines; ``request`` (the resource request as Ray prints it), ``bundles`` and
        ``strategy`` of a pending placement group, ``placement_group``, ``task_id``,
        ``waited_seconds`` (vLLM), ``kind`` (claimed, infeasible, no_nodes, waiting, pending).

    Fix
        Compare what is asked with what is free: ``ray status`` (Demands against Usage), ``ray list
        placement-groups`` (a previous run's groups still holding GPUs: remove them, or ``ray
        stop``). Then ask for less: fewer actors or GPUs per actor (verl:
        ``trainer.n_gpus_per_node``, ``actor_rollout_ref.rollout.tensor_model_parallel_size``;
        OpenRLHF: ``--colocate_all_models``, the ``*_num_gpus_per_node`` options).

        The cluster must also see the GPUs: ``ray start --num-gpus`` on every node, and a node's
        CUDA_VISIBLE_DEVICES before Ray starts; a STRICT_PACK bundle set must fit in one node.

    References
        OpenRLHF/OpenRLHF#516, YeWR/EfficientZero#44, ray-project/llm-applications#58,
        secretflow/secretflow#192, alpa-projects/alpa#875 (cannot be scheduled right now),
        Jiayi-Pan/TinyZero#94, rllm-org/rllm#35, real-stanford/scalingup#6 (no available node
        types), ray-project/ray#21097 (the older wording, required resources),
        ray-project/ray#14941 (the GCS's placement group), gpustack/gpustack#5509 and
        vllm-project/aibrix#927 (vLLM waiting for its placement group), verl-project/verl#2596,
        ray-project/ray#47792, ray-project/ray#42683 (pending demands in ``ray status``).
    """

    code = "SD534"
    name = "ray-unschedulable"
    severity = Severity.ERROR
    headline = "Ray cannot schedule a resource request"
    patterns = (_CLAIMED, _INFEASIBLE, _OLD_CLAIMED, _REQUIRED, _NO_NODES, _VLLM_WAIT, _PENDING)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        return {"kind": _KIND[match.re.pattern], **super().details(match)}

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            kinds = {_KIND[match.re.pattern] for _, match in matching_lines(self.program(), window.log)}
            severity = Severity.WARNING if kinds == {"pending"} else Severity.ERROR
            evidence = dict(found.evidence)
            yield self.finding(found.ranks, _summary(evidence), evidence, severity=severity)


def _summary(evidence: dict[str, Any]) -> str:
    why = _WHY[evidence["kind"]].format(**evidence)
    if evidence["kind"] == "pending":
        return f"Ray has not placed {_what(evidence)} yet: {why}; until it is, {_WAITS}"
    return f"Ray cannot schedule {_what(evidence)}: {why}; {_WAITS} for good"


def _what(evidence: dict[str, Any]) -> str:
    if "request" in evidence:
        bundles = (f" * {evidence['bundles']} ({evidence['strategy']})" if "bundles" in evidence
                   else "")
        return f"{evidence['request']}{bundles}"
    if "placement_group" in evidence:
        return f"placement group {evidence['placement_group']}"
    return f"actor or task {evidence['task_id']}" if "task_id" in evidence else "a request"
