"""SD532 ray-actor-died."""
from __future__ import annotations

import re
from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature

# the exit detail ends where Ray's list of usual causes starts (two wordings) or with the line
_DETAIL_END = r"(?= There are some potential root causes| Some common causes include|$)"
_DIED = "The actor died unexpectedly before finishing this task"
# the fields Ray prints under ActorDiedError / RayActorError, one a line (ip: may be a md link)
_FIELD = re.compile(r"(?:^|[\s:\]])(class_name|actor_id|pid|name|ip): \[?([^\s\]]+)")
_FIELD_KEYS = {"class_name": "actor_class", "actor_id": "actor_id", "pid": "pid",
               "name": "actor_name", "ip": "node_ip"}
_NODE_DIED = re.compile(r"The actor (?:is dead|died) because its node has died\. Node Id: (\w+)")
_BLOCK_LINES = 8    # lines after ActorDiedError where Ray lists the actor and why it died
_CREATION = "The actor died because of an error raised in its creation task"
_TRACEBACK_LINES = 60   # lines after it where the traceback of its __init__ ends
# what Ray puts before a line it forwards from an actor's log: "(LLMRayActor pid=42) "
_RAY_PREFIX = re.compile(r"^(?:\x1b\[\d+m)?\(\w+ pid=\d+(?:, ip=[^)\s]+)?\)(?:\x1b\[\d+m)? ")
_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)\b(?:\(\w+\))?: .+)$")
_OOM_FIX = ("The node ran out of host memory and the worker was killed for it: run fewer workers "
            "per node (rollout, reward, data-loading actors), look for a leak in the actor (the "
            "memory users `ray logs raylet.out -ip <node>` lists), or give the node more memory. "
            "`RAY_memory_usage_threshold` (0.95 by default) is where Ray's memory monitor kills; "
            "past it the kernel's OOM killer does (`dmesg`).")
_CREATION_FIX = ("The actor's __init__ raised: read that exception and the traceback above it "
                 "(an engine that cannot start: its arguments, its version against the "
                 "trainer's, the GPUs Ray gave it). Every later call to the actor fails, and "
                 "a loop that waits on it waits for good.")
_NODE_FIX = ("The actor's node died with it (see the node-dead finding, SD533): read that node's "
             "`/tmp/ray/session_latest/logs/raylet.out` and its `dmesg`; `max_restarts` on the "
             "actor lets Ray start it again on another node.")


class RayActorDied(LogSignature):
    """A Ray actor is dead: its worker process died or was killed, or its ``__init__`` raised.

    What it does
        Matches what Ray prints when an actor dies in its creation task (``The actor died
        because of an error raised in its creation task, ray::Class.__init__()``, with the
        exception its ``__init__`` raised, from the traceback under it: a rollout engine that
        cannot start), and when an actor's worker process ends under it: the driver's
        ``ActorDiedError`` / ``RayActorError: The actor died unexpectedly before finishing this
        task`` with the fields under it (``class_name``, ``actor_id``, ``pid``, ``ip``) and ``The
        actor is dead because its worker process has died. Worker exit type: ... Worker exit
        detail: ...`` (or ``because its owner has died``); the raylet's ``A worker died or was
        killed while executing a task by an unexpected system error`` (with the worker's node,
        address, pid, exit type and detail); Ray's memory monitor killing a worker (``Memory on
        the node ... exceeds the memory usage threshold``, Ray <= 2.1's ``System memory low at
        node``, and the raylet's ``N Workers (tasks / actors) killed due to memory pressure
        (OOM)``). Critical; an error where only a task (not an actor) was killed, which Ray
        retries.

    Why is this bad?
        In verl, OpenRLHF or a Ray Train job the trainer, rollout and reward workers are actors:
        an actor without ``max_restarts`` does not come back, every call to it raises, and the
        driver waits on the rest of its group (a collective, a ``ray.get`` on all workers) until
        it fails or hangs. The cause is in the exit detail, not in the driver's traceback.

    Evidence
        the lines; ``actor_class``, ``actor_id``, ``actor_name``, ``pid`` and ``node_ip`` of the
        dead actor; ``exit_type`` and ``exit_detail``; ``owner_ip`` where its owner died; for the
        memory monitor ``used`` / ``total`` / ``usage`` / ``threshold`` of the node, the killed
        ``task_name``, ``oom_killed`` and ``crashed`` counts; ``creation`` and ``raised`` (the
        exception of its ``__init__``) for a creation task. The rank, where the dead worker's
        pid is one of the job's ranks (verl's and OpenRLHF's workers are Ray actors).

    Fix
        Find why the worker ended: the actor's own log
        (``/tmp/ray/session_latest/logs/worker-*.err`` on its node) for a crash, the node's
        ``dmesg`` for a SIGKILL (the OOM killer); for memory, fewer workers per node and Ray's
        memory monitor (``RAY_memory_usage_threshold``). An actor that may die of a transient
        cause needs ``max_restarts`` (and ``max_task_retries``).

        Memory: a killed worker's exit detail says the node ran low on memory (exit type
        ``NODE_OUT_OF_MEMORY``, or Ray's memory monitor lines); the exit detail "connection error
        code 2. End of file" only says the process vanished, the kernel log of its node says why.

    References
        OpenRLHF/OpenRLHF#358 and OpenRLHF/OpenRLHF#702 (a vLLM engine actor whose __init__
        raised), verl-project/verl#4921 (ActorDiedError of verl's WorkerDict, the newer wording of the
        causes), hkust-nlp/simpleRL-reason#98 (RayActorError), Unakar/Logic-RL#18 (the older
        wording), AgentR1/Agent-R1#33 (exceeded K8s pod memory limits),
        primihub/primihub-platform#122 (NODE_OUT_OF_MEMORY), ray-project/ray#28778 (USER_ERROR,
        node low on memory), hiyouga/EasyR1#324 (its owner died), ray-project/ray#24495 and
        RLinf/RLinf#804 (the raylet's line, RayTask ID and Lease ID forms),
        modin-project/modin#5659 (the leased worker has unrecoverable failure),
        hiyouga/EasyR1#185 and jchengai/planTF#28 (workers killed due to memory pressure),
        ray-project/ray#32730 (the memory monitor's kill), ray-project/ray#27716 and
        ray-project/ray#28774 (Ray <= 2.1's System memory low).
        Lines of further projects: real-stanford/flingbot#11 (Ray OOM killer detail: node at 95.07%
        memory, the SimEnv actor (pid 4331) is killed).
    """

    code = "SD532"
    name = "ray-actor-died"
    severity = Severity.CRITICAL
    headline = "A Ray actor's worker process died"
    patterns = (
        r"The actor died because of an error raised in its (?P<creation>creation task), "
        r"(?:\x1b\[\d+m)?ray::(?P<actor_class>[\w.]+)\.__init__\(\)(?:\x1b\[\d+m)?"
        r"(?: \(pid=(?P<pid>\d+), ip=(?P<node_ip>[^,\s)]+)(?:, actor_id=(?P<actor_id>\w+))?)?",
        r"(?:ActorDiedError|RayActorError): " + _DIED,
        r"The actor (?:is dead|died) because its worker process has died\. Worker exit type: "
        r"(?P<exit_type>\w+) Worker exit detail: (?P<exit_detail>.+?)" + _DETAIL_END,
        r"The actor (?:is dead|died) because its owner has died\. Owner Id: \w+ Owner Ip address: "
        r"(?P<owner_ip>\S+) Owner worker exit type: (?P<exit_type>\w+) Worker exit detail: "
        r"(?P<exit_detail>.+?)" + _DETAIL_END,
        r"A worker died or was killed while executing a task by an unexpected system error\."
        r"(?:.*? Node ID: (?P<node_id>\w+) Worker IP address: (?P<node_ip>\S+) Worker port: \d+ "
        r"Worker PID: (?P<pid>\d+) Worker exit type: (?P<exit_type>\w+) Worker exit detail: "
        r"(?P<exit_detail>.+?)" + _DETAIL_END + ")?",
        r"(?P<oom_killed>\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\), "
        r"(?P<crashed>\d+) Workers crashed due to other reasons at node \(ID: (?P<node_id>\w+), "
        r"IP: (?P<node_ip>[^)\s]+)\)",
        r"Memory on the node \(IP: (?P<node_ip>[^,\s]+), ID: (?P<node_id>\w+)\) where the task "
        r"(?:\((?:task ID: (?P<task_id>\w+)|actor ID: (?P<actor_id>\w+)), name=(?P<task_name>.*?), "
        r"pid=(?P<pid>\d+), memory used=(?P<task_memory>[\d.]+GB)\) )?was running was "
        r"(?P<used>[\d.]+GB) / (?P<total>[\d.]+GB) \((?P<usage>[\d.]+)\), which exceeds the "
        r"memory usage threshold of (?P<threshold>\d+(?:\.\d+)?)",
        r"System memory low at node with IP (?P<node_ip>[\d.]+)\. Used memory "
        r"\((?P<used>[\d.]+GB)\) / total capacity \((?P<total>[\d.]+GB)\) \((?P<usage>[\d.]+)\) "
        r"exceeds threshold (?P<threshold>\d+(?:\.\d+)?), killing latest task with name "
        r"(?P<task_name>.*?) and (?:actor ID (?P<actor_id>\w+)|task ID (?P<task_id>\w+))",
    )

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            evidence = dict(found.evidence)
            for key, value in _actor_block(window.log).items():
                evidence.setdefault(key, value)
            if "creation" in evidence:
                evidence.setdefault("raised", _raised(window.log))
            rank = _rank_of(window, evidence.get("pid"))
            ranks = (rank,) if rank is not None else found.ranks
            summary = _summary(evidence)
            yield self.finding(ranks, f"rank {rank}: {summary}" if rank is not None else summary,
                               evidence, _fix(evidence), _severity(evidence))


def _rank_of(window: Window, pid: Any) -> int | None:
    """The rank whose process the dead worker was (its pid, as Ray names it, is a rank's)."""
    if not str(pid or "").isdigit():
        return None
    return next((r.rank for r in window.ranks if r.pid == int(str(pid))), None)


def _actor_block(lines: tuple[LogLine, ...]) -> dict[str, str]:
    """The fields Ray lists under the first ActorDiedError / RayActorError (class, id, pid, ip)
    and, where its last line says so, the node that died under it."""
    start = next((i for i, line in enumerate(lines) if _DIED in line.text), None)
    if start is None:
        return {}
    fields: dict[str, str] = {}
    for line in lines[start + 1:start + 1 + _BLOCK_LINES]:
        if match := _NODE_DIED.search(line.text):
            fields["dead_node"] = match.group(1)
        if "The actor " in line.text and " because " in line.text:
            break
        if match := _FIELD.search(line.text):
            fields.setdefault(_FIELD_KEYS[match.group(1)], match.group(2))
    return fields


def _raised(lines: tuple[LogLine, ...]) -> str:
    """The exception the actor's ``__init__`` raised: the last exception line of the traceback
    Ray prints under its creation-task line ('' when none came)."""
    start = next((i for i, line in enumerate(lines) if _CREATION in line.text), None)
    if start is None:
        return ""
    raised = [m.group(1) for line in lines[start + 1:start + 1 + _TRACEBACK_LINES]
              if (m := _EXCEPTION.match(_RAY_PREFIX.sub("", line.text.strip())))
              and "ray.exceptions" not in m.group(1)]
    return raised[-1][:400] if raised else ""


def _summary(evidence: dict[str, Any]) -> str:
    return f"{_who(evidence)} died{_where(evidence)}: {_why(evidence)}"


def _who(evidence: dict[str, Any]) -> str:
    name = evidence.get("actor_class") or evidence.get("task_name")
    ident = evidence.get("actor_id")
    if "oom_killed" in evidence:
        return "Ray workers (tasks / actors)"
    if ident:
        return f"Ray actor {name} ({ident})" if name else f"Ray actor {ident}"
    if name:
        return f"The Ray worker running {name}"
    actor = any("The actor " in line for line in evidence.get("lines", ()))
    return "A Ray actor" if actor else "A Ray worker"


def _where(evidence: dict[str, Any]) -> str:
    pid, node = evidence.get("pid"), evidence.get("node_ip")
    if pid and node:
        return f" (pid {pid} on {node})"
    if pid:
        return f" (pid {pid})"
    return f" (on {node})" if node else ""


def _why(evidence: dict[str, Any]) -> str:
    exit_ = f"{evidence.get('exit_type')}: {evidence.get('exit_detail', '').strip()}"
    if "creation" in evidence:
        raised = evidence.get("raised")
        return (f"its __init__ raised {raised}" if raised else "its __init__ raised (the "
                "traceback under Ray's line says what)") + "; every call to it fails"
    if "owner_ip" in evidence:
        return f"its owner (the process that created it, on {evidence['owner_ip']}) died ({exit_})"
    if "exit_type" in evidence:
        return f"its worker process ended ({exit_})"
    if "dead_node" in evidence:
        return f"its node {evidence['dead_node']} died"
    if "threshold" in evidence:
        return (f"Ray's memory monitor killed it, the node's memory {evidence['used']} / "
                f"{evidence['total']} ({evidence['usage']}) over the threshold "
                f"{evidence['threshold']}")
    if "oom_killed" in evidence:
        return (f"{evidence['oom_killed']} killed by Ray's memory monitor (OOM), "
                f"{evidence['crashed']} crashed for other reasons")
    return "its worker process died (Ray says why in the lines that follow, else the worker's log)"


def _fix(evidence: dict[str, Any]) -> str | None:
    """The fix for this death: its creation, memory, the node, else the rule's own (None)."""
    if "creation" in evidence:
        return _CREATION_FIX
    if _out_of_memory(evidence):
        return _OOM_FIX
    return _NODE_FIX if "dead_node" in evidence else None


def _out_of_memory(evidence: dict[str, Any]) -> bool:
    """Whether the worker died of the node's memory (Ray's monitor, the node out of memory)."""
    detail = str(evidence.get("exit_detail", "")).lower()
    return (evidence.get("exit_type") == "NODE_OUT_OF_MEMORY" or "memory" in detail
            or "threshold" in evidence or evidence.get("oom_killed", "0") != "0")


def _severity(evidence: dict[str, Any]) -> Severity:
    """Critical; an error where only a task was killed (Ray retries a task, not an actor)."""
    task_only = "task_id" in evidence and not {"actor_id", "actor_class", "exit_type"} & set(
        evidence)
    return Severity.ERROR if task_only else Severity.CRITICAL
