"""What SD120 blames in a Ray job whose ranks all wait (or that has none): the innermost running
call of the chain the driver waits on, else the job's processes not idle between tasks; and
the kind of wait that holds them, from their stacks and Ray's state."""
from __future__ import annotations

from support import quoted_threads
from stalldoc.analysis.outside_blame import blamed_processes, outside_cause
from stalldoc.model.ray_job import (ACTOR, DRIVER, WORKER, JobOutside, OutsideSeen,
                                    RayPlacementGroup, RayProcess, RayState, RayTask)
from stalldoc.model.stacks import BETWEEN_TASKS, RankStacks

# an OpenRLHF vLLM engine's worker joining the trainer's model-update group, whose other members
# never come (OpenRLHF#958, as py-spy dumps it)
WEIGHT_SYNC_GROUP = """\
Thread 5112 (idle): "MainThread"
    _create_c10d_store (torch/distributed/rendezvous.py:189)
    _tcp_rendezvous_handler (torch/distributed/rendezvous.py:214)
    init_process_group (torch/distributed/distributed_c10d.py:1520)
    wrapper (torch/distributed/c10d_logger.py:83)
    init_process_group (openrlhf/utils/distributed_util.py:57)
    init_process_group (openrlhf/trainer/ray/vllm_worker_wrap.py:24)
    _resume_span (ray/util/tracing/tracing_helper.py:467)
    actor_method_executor (ray/_private/function_manager.py:696)
    main_loop (ray/_private/worker.py:946)
    <module> (ray/_private/workers/default_worker.py:297)
"""
RAY_GET = """\
Thread 4000 (idle): "MainThread"
    get_objects (ray/_private/worker.py:897)
    get (ray/_private/worker.py:2723)
    wrapper (ray/_private/client_mode_hook.py:103)
    fit (openrlhf/trainer/ppo_trainer.py:211)
"""


def seen(pid: int, role: str, kind: str, text: str = "", cls: str = "", peers=()) -> OutsideSeen:
    stacks = RankStacks(-1, pid, 0.0, "py-spy", quoted_threads(text.replace("5112", str(pid))
                                                                 .replace("4000", str(pid))))
    return OutsideSeen(RayProcess(pid, role, cls), stacks if text else None, kind,
                       peers=tuple(peers))


def call(name: str, pid: int) -> RayTask:
    return RayTask(name, "RUNNING", actor_id=f"a{pid}", pid=pid, started_at=0.0)


def test_the_innermost_call_of_the_chain_is_blamed_in_its_rendezvous():
    # GIVEN the driver waiting on a TaskRunner's run, itself waiting on the engine's
    # init_model_update_group, which sits in the group's rendezvous; an idle rollout worker
    driver = seen(4000, DRIVER, "waiting: ray.get", RAY_GET)
    runner = seen(4100, ACTOR, "waiting: ray.get", RAY_GET, "TaskRunner")
    engine = seen(5112, ACTOR, "waiting: collective", WEIGHT_SYNC_GROUP, "LLMRayActor")
    idle = seen(5200, ACTOR, BETWEEN_TASKS, cls="RolloutWorker")
    calls = [(call("TaskRunner.run", 4100), runner),
             (call("LLMRayActor.init_model_update_group", 5112), engine)]
    outside = JobOutside(0.0, (driver, runner, engine, idle), RayState(tasks=tuple(
        t for t, _ in calls)))
    # THEN the engine is blamed alone, in a rendezvous whose members have not joined
    held = blamed_processes(outside, calls)
    assert [s.process.pid for s in held] == [5112]
    cause = outside_cause(outside, held)
    assert cause is not None and cause.kind == "rendezvous_incomplete", cause
    assert cause.says == ("the job waits on actor LLMRayActor (pid 5112): a process group's "
                          "rendezvous whose members have not all joined"), cause.says
    assert "init_process_group" in cause.fix


def test_calls_that_all_wait_on_ray_get_are_all_blamed():
    # GIVEN two calls, each waiting in ray.get on what Ray's state does not show running
    a = seen(4100, ACTOR, "waiting: ray.get", RAY_GET, "Rollout")
    b = seen(4200, ACTOR, "waiting: ray.get", RAY_GET, "Reward")
    calls = [(call("Rollout.generate", 4100), a), (call("Reward.score", 4200), b)]
    outside = JobOutside(0.0, (a, b), RayState(tasks=tuple(t for t, _ in calls)))
    held = blamed_processes(outside, calls)
    # THEN both are blamed, and no cause is said (nothing says why they wait)
    assert [s.process.pid for s in held] == [4100, 4200]
    assert outside_cause(outside, held) is None


def test_without_state_api_an_actor_in_a_call_is_blamed_over_the_driver_waiting_on_it():
    # GIVEN no state API (a dashboard-less Ray): the driver in ray.get, verl's TaskRunner in
    # ray.get too, in its call (it waits for a placement group no one can say is pending)
    driver = seen(4000, DRIVER, "waiting: ray.get", RAY_GET)
    runner = seen(4100, ACTOR, "waiting: ray.get", RAY_GET, "TaskRunner")
    outside = JobOutside(0.0, (driver, runner), None)
    # THEN the TaskRunner is blamed, the driver not; no cause said
    held = blamed_processes(outside, [])
    assert held == [runner] and outside_cause(outside, held) is None
    # AND a driver alone in ray.get (what it waits on shows nowhere) is blamed
    alone = JobOutside(0.0, (driver, seen(4200, WORKER, BETWEEN_TASKS)), None)
    assert blamed_processes(alone, []) == [driver]


def test_without_state_api_the_working_driver_is_blamed_as_busy():
    # GIVEN no call known (no state API): the driver works in one place, an actor idles
    driver = OutsideSeen(RayProcess(4000, DRIVER), None, "working", busy_for=93.4)
    idle = seen(5200, ACTOR, BETWEEN_TASKS, cls="RolloutWorker")
    outside = JobOutside(0.0, (driver, idle), None)
    held = blamed_processes(outside, [])
    assert held == [driver]
    cause = outside_cause(outside, held)
    assert cause is not None and (cause.kind, cause.facts) == ("busy", {"busy_seconds": 93.4})


def test_a_wait_on_a_group_ray_has_not_placed_is_unschedulable():
    # GIVEN the driver (vLLM's engine in it) waiting in ray.get for its placement group, which
    # Ray has not placed; a task worker idle
    driver = seen(4000, DRIVER, "waiting: ray.get", RAY_GET)
    worker = seen(4300, WORKER, BETWEEN_TASKS)
    group = RayPlacementGroup("pg1", "", "PENDING", ("{'GPU': 1.0}",) * 2, "NO_RESOURCES")
    outside = JobOutside(0.0, (driver, worker), RayState(placement_groups=(group,)))
    held = blamed_processes(outside, [])
    cause = outside_cause(outside, held)
    assert held == [driver] and cause is not None
    assert (cause.kind, cause.facts) == ("placement_group_not_placed", {"groups": ["pg1"]})
    # AND once the group is placed, the same wait has no cause said
    placed = JobOutside(0.0, (driver, worker), RayState(placement_groups=(
        RayPlacementGroup("pg1", "", "CREATED", group.bundles),)))
    assert outside_cause(placed, held) is None


def test_a_task_waiting_on_a_server_outside_the_job():
    # GIVEN a plain task reading from a reward server that accepted and never answers
    task = seen(4300, WORKER, "waiting: socket", peers=("10.0.0.7:8000",))
    outside = JobOutside(0.0, (task,), None)
    held = blamed_processes(outside, [])
    cause = outside_cause(outside, held)
    assert held == [task] and cause is not None
    assert (cause.kind, cause.facts) == ("server_not_answering", {"peers": ["10.0.0.7:8000"]})

