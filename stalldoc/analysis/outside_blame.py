"""Which processes outside the ranks hold a Ray job whose ranks all wait (or that has none),
and what kind of wait holds them: what SD120 blames and the cause it says.

The job waits on the actor calls that run while nothing works: of those, the ones that do not
themselves wait in ``ray.get`` on another call (the innermost links of the chain; all of them
where every one waits so). With no call running (or none known: no state API), the processes
of the job that are not idle between tasks, the driver included: its own work or wait holds the
job; again those not waiting in ``ray.get`` where any is not, and never a driver in ``ray.get``
while an actor or a task worker is in a call (what it waits on runs there). A blamed process is never a guess
by name: it is the pid Ray's state API or the process's own agent said runs the call, or the
driver, actor or task worker the agents said it is.
"""
from __future__ import annotations

from typing import Iterable

from stalldoc.analysis.causes import Cause
from stalldoc.model.ray_job import DRIVER, JobOutside, OutsideSeen, RayTask
from stalldoc.model.stacks import BETWEEN_TASKS

RAY_GET = "waiting: ray.get"
# torch.distributed's rendezvous: a process group's members meeting in its store before any
# collective (init_process_group, new_group, a store-based barrier), or vLLM's stateless one
_RENDEZVOUS = frozenset({"init_process_group", "rendezvous", "_create_c10d_store",
                         "_store_based_barrier", "_new_group_with_tag", "new_group",
                         "_tcp_rendezvous_handler", "_env_rendezvous_handler",
                         "StatelessProcessGroup.create"})
PLACEMENT_FIX = (
    "Ray places a placement group only when one node (STRICT_PACK) or the cluster holds every "
    "bundle at once: compare the bundles asked (`ray status`, `ray list placement-groups "
    "--detail`) with what each node registered (`ray list nodes --detail`: a GPU detected as "
    "something else, CPUs held by the job's own actors). Ask for what the nodes have (fewer "
    "or smaller bundles, num_gpus_per_node, PACK over STRICT_PACK), free what the job already "
    "holds, or add the node; give the wait a deadline (`ray.get(pg.ready(), timeout=...)`).")
RENDEZVOUS_FIX = (
    "A process group's rendezvous ends only when all world_size members join: check that every "
    "member the world counts is started (an engine's workers at its tensor_parallel_size, the "
    "trainer's side of a weight-sync group, every DP replica) and reaches the same "
    "MASTER_ADDR:MASTER_PORT; pass a timeout to init_process_group so that a member that never "
    "comes fails the job instead of holding it.")


def blamed_processes(outside: JobOutside, calls: Iterable[tuple[RayTask, OutsideSeen]]
                     ) -> list[OutsideSeen]:
    """The processes the job waits on, each once, in the order found."""
    running = [seen for _, seen in calls]
    if not running:
        running = [s for s in outside.seen if s.kind != BETWEEN_TASKS]
    # a driver in ray.get waits on what the job's actors and tasks run: one of them in a call
    # is further down the chain, whatever it waits on
    deeper = [s for s in running if s.process.role != DRIVER or s.kind != RAY_GET]
    innermost = [s for s in deeper if s.kind != RAY_GET] or deeper or running
    return list({s.process.pid: s for s in innermost}.values())


def outside_cause(outside: JobOutside, blamed: list[OutsideSeen]) -> Cause | None:
    """What kind of wait holds the blamed processes, where their stacks and Ray's state say it;
    None where they do not."""
    if not blamed:
        return None
    ray = outside.ray
    who = f"the job waits on {', '.join(s.process.label for s in blamed)}: "
    pending = [g for g in ray.placement_groups if g.pending] if ray else []
    if pending and any(s.kind == RAY_GET for s in blamed):
        return Cause("placement_group_not_placed", f"{who}a placement group Ray has not "
                     "placed", PLACEMENT_FIX,
                     {"groups": [g.name or g.group_id for g in pending]})
    if ray is not None and ray.held_by_actor():
        return Cause("actor_not_alive", f"{who}a call held by an actor that is not alive", "",
                     {})
    if any(_in_rendezvous(s) for s in blamed):
        return Cause("rendezvous_incomplete", f"{who}a process group's rendezvous whose "
                     "members have not all joined", RENDEZVOUS_FIX, {})
    if any(s.peers for s in blamed):
        return Cause("server_not_answering", f"{who}a server that does not answer", "",
                     {"peers": sorted({p for s in blamed for p in s.peers})})
    if all(s.kind == "working" for s in blamed):
        return Cause("busy", f"{who}its own work, while nothing else of the job works", "",
                     {"busy_seconds": round(max(s.busy_for for s in blamed), 1)})
    return None


def _in_rendezvous(seen: OutsideSeen) -> bool:
    main = seen.stacks.main if seen.stacks else None
    return main is not None and any(
        f.function in _RENDEZVOUS or f.name in _RENDEZVOUS for f in main.frames)
