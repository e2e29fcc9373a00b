"""A Ray job as Ray itself knows it: which process is the driver and which an actor (its agent's
``ray-<pid>.json``, ``agent/ray_facts.py``), and at a stall the cluster's state API, served by
its dashboard (``/api/v0/actors``, ``/api/v0/tasks``: the records ``ray list actors`` and
``ray list tasks`` print), read over HTTP at the address the driver's Ray gave it. ray is never
imported here. A cluster without the dashboard (``ray`` installed without ``[default]``, or
``include_dashboard=False``) has no state API: the stacks then say what each process does."""
from __future__ import annotations

import json
import os
import re
import urllib.request
from typing import Any, Iterable

from stalldoc.agent.ray_facts import facts_path
from stalldoc.model.ray_job import (ACTOR, DRIVER, WORKER, RayActor, RayPlacementGroup,
                                    RayProcess, RayState, RayTask)

MAX_BYTES = 8 << 20
LIMIT = 1000
_ADDRESS = re.compile(r"^(https?://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_FINISHED = ("FINISHED", "FAILED")


def ray_processes(directory: str | None, pids: Iterable[int]) -> dict[int, RayProcess]:
    """The driver and actors among ``pids``, as their agents say (pid -> process)."""
    found: dict[int, RayProcess] = {}
    for pid in pids:
        facts = _facts(directory, pid) if directory else None
        if facts is None:
            continue
        role = _role(facts)
        if role:
            found[pid] = RayProcess(pid, role, str(facts.get("actor_class", "")),
                                    str(facts.get("actor_id", "")), str(facts.get("job_id", "")),
                                    str(facts.get("dashboard", "")),
                                    str(facts.get("node_id", "")),
                                    role == DRIVER and facts.get("cluster") == "joined",
                                    daemons=_pids(facts.get("daemons")))
    return found


def _role(facts: dict[str, Any]) -> str:
    """The driver, an actor, or a worker that runs plain tasks ('' for anything else Ray
    starts: its I/O and spilling workers say another mode)."""
    mode = facts.get("mode")
    if mode == "driver":
        return DRIVER
    return (ACTOR if facts.get("actor_id") else WORKER) if mode == "worker" else ""


def _pids(value: Any) -> tuple[int, ...]:
    """'12,34' -> (12, 34); anything else -> ()."""
    if not isinstance(value, str):
        return ()
    return tuple(int(p) for p in value.split(",") if p.isdigit() and int(p) > 0)[:64]


def drivers(directory: str | None, pids: Iterable[int]) -> set[int]:
    """The processes among ``pids`` whose Ray says they are a job's driver."""
    try:
        names = set(os.listdir(directory)) if directory else set()
    except OSError:
        return set()
    named = [p for p in pids if os.path.basename(facts_path("", p)) in names]
    return {p for p, process in ray_processes(directory, named).items() if process.role == DRIVER}


def _facts(directory: str, pid: int) -> dict[str, Any] | None:
    try:
        with open(facts_path(directory, pid), encoding="utf-8") as fh:
            facts = json.loads(fh.read(65536))
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) else None


def read_state(dashboard: str, timeout: float = 3.0) -> RayState:
    """The cluster's actors and its unfinished tasks, from the dashboard at ``dashboard``."""
    if not _ADDRESS.match(dashboard):
        return RayState(error="no Ray dashboard address (is ray[default] installed?)")
    try:
        return _state(dashboard, "", timeout, groups=True)
    except (OSError, ValueError) as exc:
        base = _base(dashboard)
        return RayState(source=base, error=f"Ray's state API at {base} did not answer: {exc}")


def job_state(dashboard: str, job_id: str, timeout: float = 3.0, groups: bool = False
              ) -> RayState:
    """The actors and unfinished tasks of one job (``job_id`` as Ray writes it: ``01000000``),
    on every node, and with ``groups`` its placement groups; raises OSError or ValueError when
    the state API does not answer."""
    if not _ADDRESS.match(dashboard) or not re.fullmatch(r"[0-9a-fA-F]{1,64}", job_id):
        raise ValueError(f"no Ray state API to ask for job {job_id!r} at {dashboard!r}")
    return _state(dashboard, job_id, timeout, groups)


def _state(dashboard: str, job_id: str, timeout: float, groups: bool) -> RayState:
    base = _base(dashboard)
    actors = _records(f"{base}/api/v0/actors?detail=1&limit={LIMIT}{_of(job_id)}", timeout)
    tasks = _records(f"{base}/api/v0/tasks?detail=1&limit={LIMIT}{_of(job_id)}", timeout)
    placed = _records(f"{base}/api/v0/placement_groups?detail=1&limit={LIMIT}"
                      f"{_of(job_id, 'creator_job_id')}", timeout) if groups else []
    return RayState(tuple(_actor(a) for a in actors),
                    tuple(_task(t) for t in tasks if t.get("state") not in _FINISHED), base,
                    placement_groups=tuple(_group(g) for g in placed))


def _of(job_id: str, key: str = "job_id") -> str:
    """The query that keeps one job's records ('' for all of them)."""
    return f"&filter_keys={key}&filter_predicates=%3D&filter_values={job_id}" if job_id else ""


def _group(record: dict[str, Any]) -> RayPlacementGroup:
    bundles = record.get("bundles") or []
    asks = tuple(str(b.get("unit_resources") or {}) for b in bundles if isinstance(b, dict))
    stats = record.get("stats") or {}
    return RayPlacementGroup(str(record.get("placement_group_id", "")),
                             str(record.get("name") or ""), str(record.get("state", "")),
                             asks[:16], str(stats.get("scheduling_state") or "")
                             if isinstance(stats, dict) else "")


def _base(dashboard: str) -> str:
    return dashboard if dashboard.startswith("http") else f"http://{dashboard}"


def _records(url: str, timeout: float) -> list[dict[str, Any]]:
    with _OPENER.open(url, timeout=timeout) as response:
        body = json.loads(response.read(MAX_BYTES))
    result = body.get("data", {}).get("result", {}) if isinstance(body, dict) else {}
    records = result.get("result", []) if isinstance(result, dict) else []
    return [r for r in records if isinstance(r, dict)]


def _actor(record: dict[str, Any]) -> RayActor:
    death = record.get("death_cause") or {}
    context = next(iter(death.values()), {}) if isinstance(death, dict) and death else {}
    words = context.get("error_message", "") if isinstance(context, dict) else ""
    asks = record.get("required_resources") or {}
    return RayActor(str(record.get("actor_id", "")), str(record.get("class_name", "")),
                    str(record.get("state", "")), _pid(record.get("pid")),
                    str(record.get("name") or ""), str(words)[:2000],
                    str(asks) if isinstance(asks, dict) and asks else "",
                    str(record.get("job_id") or ""), str(record.get("node_id") or ""))


def _task(record: dict[str, Any]) -> RayTask:
    started = record.get("start_time_ms")
    return RayTask(str(record.get("func_or_class_name") or record.get("name") or ""),
                   str(record.get("state", "")), str(record.get("actor_id") or ""),
                   _pid(record.get("worker_pid")),
                   started / 1000 if isinstance(started, (int, float)) else None,
                   str(record.get("node_id") or ""))


def _pid(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
