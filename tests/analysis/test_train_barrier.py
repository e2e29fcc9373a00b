"""A rank waiting in Ray Train's own barrier of every worker (``ray.train.report`` with a
checkpoint, ``ray.train.collective.barrier``), seen from its stack, and the cause it makes of a
rank missing from the torch collective the others wait in: they skipped the call."""
from __future__ import annotations

from support import quoted_threads
from stalldoc.analysis.train_barrier import KIND, train_barrier, train_barrier_cause
from stalldoc.model.stacks import RankStacks

# a Ray Train V2 worker (Ray 2.60) as py-spy dumps it: the actor's main thread idles in Ray's
# task loop, the training loop runs in Ray Train's thread, here in report's barrier
WORKER = """\
Thread 7001 (idle): "MainThread"
    main_loop (ray/_private/worker.py:946)
    <module> (ray/_private/workers/default_worker.py:297)
Thread 7040 (idle): "Thread-2 (_run_target)"
"""
RUNNER = """\
    train_fn (ray/train/v2/_internal/util.py:89)
    _run_target (ray/train/v2/_internal/execution/worker_group/thread_runner.py:37)
    run (threading.py:982)
"""
RAY_GET = """\
    get_objects (ray/_private/worker.py:1007)
    get (ray/_private/worker.py:3009)
    wrapper (ray/_private/client_mode_hook.py:134)
    auto_init_wrapper (ray/_private/auto_init_hook.py:22)
"""
REPORT = """\
    _sync_checkpoint_dir_name_across_ranks (ray/train/v2/_internal/execution/context.py:254)
    report (ray/train/v2/_internal/execution/context.py:474)
    report (ray/train/v2/_internal/execution/train_fn_utils.py:172)
    report (ray/train/v2/api/train_fn_utils.py:125)
    _wrapped_fn (ray/train/v2/_internal/util.py:299)
"""
IN_REPORT = WORKER + RAY_GET + REPORT + """\
    save_checkpoint (/home/me/train.py:52)
    train_func (/home/me/train.py:66)
""" + RUNNER
# the same worker in ray.train.collective.barrier(), called by the user's evaluation
IN_BARRIER = IN_REPORT.replace(REPORT + "    save_checkpoint (/home/me/train.py:52)\n", """\
    barrier (ray/train/v2/_internal/execution/collective_impl.py:22)
    barrier (ray/train/v2/_internal/execution/train_fn_utils.py:140)
    barrier (ray/train/collective/collectives.py:77)
    evaluate (/home/me/train.py:80)
""")
# a worker that waits on an actor of its own (a reward model) with ray.get: no barrier
ON_ACTOR = IN_REPORT.replace(REPORT, "    score (/home/me/reward.py:31)\n")
# a worker inside report still persisting its checkpoint (a copy to storage): working, no wait
PERSISTING = IN_REPORT.replace(RAY_GET + REPORT.splitlines(keepends=True)[0], """\
    copyfileobj (shutil.py:200)
    copyfile (shutil.py:269)
    persist_current_checkpoint (ray/train/v2/_internal/execution/storage.py:480)
    _sync_checkpoint_dir_name_across_ranks (ray/train/v2/_internal/execution/context.py:262)
""").replace("(idle): \"Thread-2", "(active): \"Thread-2")
# the other ranks: in DDP's gradient all-reduce of their next step
IN_ALL_REDUCE = WORKER + """\
    _engine_run_backward (torch/autograd/graph.py:829)
    backward (torch/autograd/__init__.py:364)
    backward (torch/_tensor.py:647)
    train_epoch (/home/me/train.py:37)
    train_func (/home/me/train.py:64)
""" + RUNNER


def stacks(rank: int, text: str) -> RankStacks:
    pid = 7001 + 100 * rank
    text = text.replace("7001", str(pid)).replace("7040", str(pid + 39))
    return RankStacks(rank, pid, 0.0, "py-spy", quoted_threads(text))


def test_the_call_the_training_thread_waits_in_is_read_from_its_frames():
    # GIVEN workers in report's barrier, in ray.train.collective.barrier, and in a ray.get of
    # their own
    # THEN the first two wait in Ray Train's barrier, named by the public call
    call, frame = train_barrier(stacks(0, IN_REPORT).main)
    assert call == "ray.train.report" and frame.name == "_sync_checkpoint_dir_name_across_ranks"
    call, frame = train_barrier(stacks(0, IN_BARRIER).main)
    assert call == "ray.train.collective.barrier" and frame.line == 22
    assert train_barrier(stacks(0, ON_ACTOR).main) is None
    # AND one still copying its checkpoint inside report works: it waits in no barrier yet
    assert train_barrier(stacks(0, PERSISTING).main) is None
    # AND a worker in DDP's all-reduce waits in no barrier of Ray Train's
    assert train_barrier(stacks(1, IN_ALL_REDUCE).main) is None


def test_ranks_that_went_past_the_barrier_are_named_as_having_skipped_it():
    # GIVEN rank 0 in report's barrier, ranks 1 and 2 in the next all-reduce (rank 0 missing)
    seen = {0: stacks(0, IN_REPORT), 1: stacks(1, IN_ALL_REDUCE), 2: stacks(2, IN_ALL_REDUCE)}
    cause = train_barrier_cause(seen, [0], [1, 2])
    # THEN ranks 1 and 2 skipped the report rank 0 waits in, rank 0's call site is said
    assert cause is not None and cause.kind == KIND
    assert cause.facts == {"call": "ray.train.report", "barrier_ranks": [0],
                           "skipped_ranks": [1, 2],
                           "barrier_frame": "save_checkpoint (/home/me/train.py:52)"}
    assert "ranks 1, 2 never joined" in cause.says and "checkpoint=None" in cause.fix


def test_no_cause_unless_every_missing_rank_is_in_the_barrier_and_no_waiting_one():
    # GIVEN a missing rank in a ray.get of its own, or waiting ranks in the barrier too, or no
    # stack of a missing rank
    barrier, reduce = stacks(0, IN_REPORT), stacks(1, IN_ALL_REDUCE)
    assert train_barrier_cause({0: stacks(0, ON_ACTOR), 1: reduce}, [0], [1]) is None
    assert train_barrier_cause({0: barrier, 1: stacks(1, IN_REPORT)}, [0], [1]) is None
    assert train_barrier_cause({0: barrier, 1: reduce, 2: reduce}, [0, 2], [1]) is None
    assert train_barrier_cause({1: reduce}, [0], [1]) is None
