"""SD120 job-waits-outside-ranks."""
from __future__ import annotations

from typing import Any, Iterator

from stalldoc.analysis.outside_blame import blamed_processes, outside_cause
from stalldoc.analysis.stacks import frame_strings
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ray_job import JobOutside, OutsideSeen, RayActor, RayPlacementGroup, RayTask
from stalldoc.model.stacks import BETWEEN_TASKS
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, blamed, join_ranks

# an actor's state in Ray's words (ray.util.state's ActorState), said as what it means
_ACTOR_STATES = {"PENDING_CREATION": "never created: no node can place it yet",
                 "DEPENDENCIES_UNREADY": "not created: its arguments are not ready",
                 "RESTARTING": "restarting", "DEAD": "dead"}


class JobWaitsOutsideRanks(Rule):
    """Every rank waits for its next task, and what should hand it out is stuck.

    What it does
        At a stall of the job itself (every rank of a Ray job idles in its task loop, and
        neither the driver nor any actor that is no rank has shown work for the stall
        timeout; or, in a Ray job with no rank known, nothing of the job has shown work and its
        actors and tasks in Ray's state API have not changed: a driver that joined a Ray
        cluster started apart, whose actors carry no agent, or a job whose driver, actors and
        task workers joined no process group), says where the job stands: the driver's
        frame, and when it waits in ``ray.get``, the actor calls that run (Ray's state API: the
        call, how long it has run, the calls queued behind it on the same actor) with that
        actor's own frame and what it waits on, and the calls that wait for an actor that is
        not alive (never created because no node can place what it asks, restarting, dead:
        with what it asks and why it died), and the job's placement groups not placed (their
        bundles, and Ray's word for why: infeasible, no resources). Which process is the
        driver, which an actor and which a task worker is what Ray says inside each (their
        agents; for a cluster started apart, its state API), never words of a command line.

    Why is this bad?
        In an RL loop the ranks only train when the driver hands them a batch. A reward
        function that never returns, an actor call blocked on a peer that never comes (a
        weight-sync group, a rendezvous), or a health check queued behind such a call holds
        the whole job, while every GPU sits idle and no collective is ever entered: PyTorch's
        watchdog never fires, and nothing is logged.

    Evidence
        the driver's pid, frame and frames and what it waits on; each actor call that runs
        (its name, actor class and pid, seconds running, its frame and frames, what it waits
        on, the calls queued behind it); the calls held by an actor that is not alive (its
        state, resources asked, death cause); the placement groups not placed (their bundles,
        Ray's scheduling state); the actors' processes; where Ray's state was read (or why it
        was not). The processes blamed (``blamed``): the running calls that wait on no other
        call, else the job's processes that are not idle between tasks (the driver's own work
        or wait); the cause where their stacks and Ray's state say it (``cause.kind``): a
        placement group not placed, an actor not alive, a process group's rendezvous whose
        members have not joined, a server that does not answer, or work in one place; the
        first blamed process's frame (``frame``).

    Fix
        Read the frame named: the driver's own code (a reward or a normaliser that does not
        end), or the actor call it waits on. Give remote calls a deadline (`ray.get(ref,
        timeout=...)`), make a weight-sync or rendezvous in an actor fail when its peer does not
        come, and never queue a health check behind a call that can block (a threaded actor with
        `max_concurrency`, or an actor of its own).

    References
        OpenRLHF#958 (vLLM engine actor stuck in weight sync, the trainer waiting),
        open-instruct PR#1454 (a health check queued behind a blocking actor call), verl PR#6673
        (a reward normalisation extremely slow on a degenerate sample).
    """

    code = "SD120"
    name = "job-waits-outside-ranks"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        outside = window.outside
        if outside is None or not outside.seen:
            return
        ranks = sorted(r.rank for r in window.ranks)
        calls = _running_calls(outside)
        seconds = window.now - outside.since
        summary = (f"{join_ranks(ranks)} wait for their next task for {seconds:.0f} s, and "
                   "the job waits outside them: ") if ranks else _no_ranks(outside, seconds)
        summary += "; ".join(_where(outside, calls, window.now)
                             or ["the driver and its actors wait too"])
        held = blamed_processes(outside, calls)
        evidence = {**_evidence(outside, calls, window.now),
                    **blamed((s.process.pid, s.process.label) for s in held)}
        if held and held[0].frame:   # the first blamed process's own frame
            evidence["frame"] = str(held[0].frame)
        yield self.caused(ranks, summary, evidence, outside_cause(outside, held))


def _where(outside: JobOutside, calls: list[tuple[RayTask, OutsideSeen]], now: float
           ) -> list[str]:
    """Where the job stands: the driver, the calls that run, the calls held by an actor not
    alive, the placement groups not placed; with no call running, what the others do."""
    driver = outside.driver
    where = [f"{driver.process.label} {_doing(driver)}"] if driver else []
    where += [_describe_call(call, seen, outside, now) for call, seen in calls]
    where += [_describe_held(call, actor) for call, actor in _held(outside)]
    where += [_describe_group(group) for group in _pending_groups(outside)]
    if not calls:
        where += [f"{s.process.label} {_doing(s)}" for s in outside.seen
                  if s is not driver and s.kind != BETWEEN_TASKS]
    return where


def _no_ranks(outside: JobOutside, seconds: float) -> str:
    """The summary's start for a job with no rank known: its actors run in a cluster started
    apart (no agent in them), or none of its processes joined a process group."""
    driver = outside.driver
    why = ("which of its processes are ranks is not known: its actors run in a Ray cluster "
           "started apart, without stalldoc's agent" if driver and driver.process.joined else
           "none of its processes is a rank: its driver, actors and tasks joined no process "
           "group")
    return f"nothing in the job has shown work for {seconds:.0f} s ({why}): "


def _doing(seen: OutsideSeen) -> str:
    frame = f" at {seen.frame}" if seen.frame else ""
    if seen.kind.startswith("waiting: "):
        peers = f" (a server at {', '.join(seen.peers[:3])})" if seen.peers else ""
        return f"waits on {seen.kind[len('waiting: '):]}{peers}{frame}"
    if seen.kind == "working":
        return f"works{frame}"
    return f"({seen.kind or 'no stack read'}){frame}"


def _running_calls(outside: JobOutside) -> list[tuple[RayTask, OutsideSeen]]:
    """The actor calls Ray runs in processes that are no rank, with what those show."""
    if outside.ray is None:
        return []
    return [(t, seen) for t in outside.ray.tasks
            if t.running and (seen := outside.of_pid(t.pid)) is not None]


def _held(outside: JobOutside) -> list[tuple[RayTask, RayActor]]:
    """Calls waiting for an actor that is not alive, one per actor."""
    if outside.ray is None:
        return []
    held = sorted(outside.ray.held_by_actor(), key=lambda h: not h[0].name.endswith("__init__"))
    return list({a.actor_id: (t, a) for t, a in held}.values())   # a method call over __init__


def _pending_groups(outside: JobOutside) -> tuple[RayPlacementGroup, ...]:
    return tuple(g for g in outside.ray.placement_groups if g.pending) if outside.ray else ()


def _describe_group(group: RayPlacementGroup) -> str:
    """'placement group rollout_pool never placed (infeasible): it asks for 2 bundles of
    {'CPU': 64.0}'."""
    how = f" ({group.scheduling.lower().replace('_', ' ')})" if group.scheduling else ""
    kinds = sorted(set(group.bundles))
    asks = (f"{len(group.bundles)} bundle(s) of {kinds[0]}" if len(kinds) == 1
            else ", ".join(kinds))
    state = "never placed" if group.state == "PENDING" else group.state.lower()
    return f"{group.label} {state}{how}: it asks for {asks}"


def _describe_held(call: RayTask, actor: RayActor) -> str:
    state = _ACTOR_STATES.get(actor.state, actor.state.lower())
    asks = f" (it asks for {actor.resources})" if actor.resources else ""
    death = f": {actor.death.splitlines()[0][:300]}" if actor.death else ""
    return f"{call.name} waits for its actor {actor.class_name}, {state}{asks}{death}"


def _describe_call(call: RayTask, seen: OutsideSeen | None, outside: JobOutside,
                   now: float) -> str:
    assert outside.ray is not None
    queued = outside.ray.queued_behind(call)
    behind = (f"{', '.join(t.name for t in queued[:3])} queued behind " if queued else "")
    ran = f", running for {now - call.started_at:.0f} s" if call.started_at else ""
    doing = f", {_doing(seen)}" if seen else ""
    return f"{behind}{call.name} (pid {call.pid}{ran}){doing}"


def _evidence(outside: JobOutside, calls: list[tuple[RayTask, OutsideSeen]],
              now: float) -> dict[str, Any]:
    driver = outside.driver
    ray = outside.ray
    return {
        "between_tasks_seconds": round(now - outside.since, 1),
        "driver": _seen(driver) if driver else None,
        "calls": [{"call": t.name, "pid": t.pid, "state": t.state,
                   "running_seconds": round(now - t.started_at, 1) if t.started_at else None,
                   "queued_behind": [q.name for q in ray.queued_behind(t)] if ray else [],
                   **_seen(s)} for t, s in calls],
        "actors": [_seen(s) for s in outside.seen if s is not driver],
        "held_by_actors": [{"call": t.name, "actor_class": a.class_name, "state": a.state,
                            "resources": a.resources, "death": a.death}
                           for t, a in _held(outside)],
        "placement_groups": [{"id": g.group_id, "name": g.name, "state": g.state,
                              "scheduling": g.scheduling, "bundles": list(g.bundles)}
                             for g in _pending_groups(outside)],
        "ray_state": ray.source if ray and not ray.error else None,
        "ray_state_error": ray.error if ray else "no Ray dashboard address published",
    }


def _seen(seen: OutsideSeen) -> dict[str, Any]:
    main = seen.stacks.main if seen.stacks else None
    return {"pid": seen.process.pid, "role": seen.process.role,
            "actor_class": seen.process.actor_class, "kind": seen.kind,
            "frame": str(seen.frame) if seen.frame else None, "frames": frame_strings(main),
            "peers": list(seen.peers)}
