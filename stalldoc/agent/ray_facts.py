"""What this process is to Ray, said by Ray itself from inside it: the driver of a job, or a
worker, and then which actor (its id and class); the job, and where the cluster's dashboard
serves its state API, the node it runs on, and whether the driver started its cluster or joined
one started apart, and the processes Ray started for a node the driver made (its daemons). The
watcher reads which process is the driver, which an actor and which a task worker from here,
never from words in a command line.

The agent's heartbeat thread calls ``RayFacts.tick`` every beat: one dictionary look-up while
the process has not imported ``ray`` (the agent never imports it); once the job connected to a
cluster (``ray.is_initialized()``), the facts are read from Ray's own worker object every
``EVERY_BEATS`` beats and ``ray-<pid>.json`` in the agent directory is written (atomically) when
they change. A worker process becomes an actor after it connects, so it is looked at until it
is one (or for ``WORKER_BEATS`` beats: a worker that runs plain tasks). Standard library only.
"""
from __future__ import annotations

import os

from stalldoc.agent.versions import write_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FILE_PREFIX = "ray-"
EVERY_BEATS = 4          # one second of heartbeats
WORKER_BEATS = 2400      # ten minutes: a task worker that never becomes an actor is left be
_DRIVER, _WORKER = 0, 1  # ray._private.worker.SCRIPT_MODE, WORKER_MODE


def facts_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{pid}.json")


def read_facts(ray: Any) -> dict[str, str] | None:
    """This process's place in its Ray job (None: not connected to a cluster)."""
    if not ray.is_initialized():
        return None
    worker = ray._private.worker.global_worker
    mode = getattr(worker, "mode", None)
    context = ray.get_runtime_context()
    actor = (context.get_actor_id() or "") if mode == _WORKER else ""
    facts = {"mode": {_DRIVER: "driver", _WORKER: "worker"}.get(mode, str(mode)),
             "job_id": str(context.get_job_id() or ""), "actor_id": actor,
             "actor_class": _actor_class(worker, actor), "dashboard": "",
             "node_id": str(context.get_node_id() or ""), "cluster": ""}
    if mode == _DRIVER:
        node = getattr(ray._private.worker, "_global_node", None)
        facts["dashboard"] = str(getattr(node, "webui_url", "") or "") if node else ""
        # a driver that started its own Ray holds the head node it made; one that joined a
        # cluster started apart (``ray start``, then ``ray.init(address=...)``) only connects
        facts["cluster"] = ("started" if getattr(node, "head", False) else "joined") \
            if node else ""
        facts["daemons"] = _daemons(node)
    return facts


def _daemons(node: Any) -> str:
    """The processes Ray started for the node this driver made (GCS, raylet, dashboard, log
    monitor...), as Ray lists them: their pids, comma separated ('' for a driver that joined a
    cluster started apart, which started none)."""
    pids: list[int] = []
    for infos in list((getattr(node, "all_processes", None) or {}).values()):
        for info in list(infos or ()):
            pid = getattr(getattr(info, "process", None), "pid", None)
            if isinstance(pid, int) and pid > 0:
                pids.append(pid)
    return ",".join(str(p) for p in sorted(set(pids)))


def _actor_class(worker: Any, actor: str) -> str:
    """The class of the actor this worker holds ('' when it holds none, or Ray hides it)."""
    if not actor:
        return ""
    for key, instance in list(getattr(worker, "actors", {}).items()):
        if getattr(key, "hex", lambda: "")() == actor:
            return type(instance).__name__
    return ""


def publish(directory: str, pid: int, facts: dict[str, str]) -> None:
    write_json(facts_path(directory, pid), facts)


class RayFacts:
    """Publishes this process's Ray facts when they change, until nothing is left to learn."""

    def __init__(self, directory: str, pid: int, modules: dict[str, Any]) -> None:
        self.directory = directory
        self.pid = pid
        self.modules = modules
        self.beats = 0
        self.last: dict[str, str] | None = None
        self.done = False

    def tick(self) -> None:
        ray = self.modules.get("ray")
        if self.done or ray is None or not hasattr(ray, "is_initialized"):
            return
        self.beats += 1
        if self.beats % EVERY_BEATS:
            return
        facts = read_facts(ray)
        if facts is None:
            return
        if facts != self.last:
            publish(self.directory, self.pid, facts)
            self.last = facts
        complete = facts["actor_class"] if facts["mode"] == "worker" else facts["dashboard"]
        self.done = bool(complete) or self.beats >= WORKER_BEATS
