"""The stall decision on recorded tick samples: no rank shows work for longer than the
threshold. Numbers are of the kind measured on real ranks here (a rank blocked in a collective:
0-1 % CPU, no I/O; a checkpoint writer to slow storage: ~3 % CPU, 4 MB/s written)."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot, PhaseRecord
from stalldoc.detect.progress import ENDING_GRACE, ProgressTracker
from stalldoc.model.samples import HostSample
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack


def agent(marker: int, phase: str = "", phases: tuple = (), rank: int = 0) -> AgentSnapshot:
    return AgentSnapshot(1, rank, 0, 1, 0, 0.0, 0.0, marker, 0.0, None,
                         (phase,) if phase else (), "", len(phases), phases, ())


def host(t: float, rank: int = 0, cpu: float = 0.5, io: float = 0.0, children: int = 0,
         children_cpu: float | None = None, status: str = "sleeping", wait: float | None = None,
         children_wait: float | None = None) -> HostSample:
    return HostSample(t, rank, 100 + rank, t * cpu / 100, 1 << 20, 4, status, 1 << 30, cpu,
                      children, children_cpu, io, wait, children_wait)


def stacks(rank: int, function: str, filename: str, line: int, active: bool) -> RankStacks:
    frame = Frame(function, filename, line)
    return RankStacks(rank, 100 + rank, 0.0, "py-spy", (ThreadStack(100 + rank, "MainThread",
                                                                    active, active, (frame,)),))


def run(tracker: ProgressTracker, seconds: int, start: int = 1, **kinds: dict) -> list:
    """Feed one tick a second for ``seconds`` from ``start``; ``kinds`` gives each rank's host
    sample fields. Returns the stalls that started."""
    started = []
    for t in range(start, start + seconds):
        tracker.observe(float(t), {}, {int(r[1:]): host(float(t), int(r[1:]), **kw)
                                       for r, kw in kinds.items()})
        began, _ = tracker.check(float(t))
        if began:
            started.append(began)
    return started


def test_every_rank_idle_is_a_stall_with_what_was_seen():
    tracker = ProgressTracker(floor=5)
    [stall] = run(tracker, 10, r0={}, r1={})
    assert stall.started_at == 1.0 and stall.detected_at == 7.0 and stall.ranks == (0, 1)
    assert stall.work[1].verdict == "idle" and stall.work[1].cpu_percent == 0.5
    assert "cpu 0%, io 0 kB/s" in stall.work[1].describe()


def test_a_rank_writing_to_slow_storage_is_slow_not_stuck():
    # rank 0 writes a checkpoint at 4 MB/s with 3 % CPU; rank 1 waits in a barrier
    tracker = ProgressTracker(floor=5)
    assert run(tracker, 30, r0={"cpu": 3.0, "io": 4e6}, r1={}) == []
    work = tracker.work()
    assert work[0].working and work[0].reason == "reading / writing 4.0 MB/s"
    assert not work[1].working and work[0].since_progress == 29.0


def test_a_rank_waiting_for_its_worker_processes_is_working():
    tracker = ProgressTracker(floor=5)
    assert run(tracker, 20, r0={"children": 2, "children_cpu": 190.0}) == []
    assert tracker.work()[0].reason == "2 child process(es) at 190% CPU"


def test_busy_rank_is_pending_until_its_stack_is_classified():
    tracker = ProgressTracker(floor=5)
    assert run(tracker, 10, r0={"cpu": 99.0}) == []      # never classified: never stuck
    assert tracker.stacks_due(10.0) == [0]
    assert tracker.work()[0].verdict == "pending"


def test_a_busy_rank_whose_markers_move_is_not_sampled_until_they_stop():
    # a training rank at 100 % CPU whose agent's counters move every tick (a GPU rank spinning
    # in its CUDA syncs between collectives): its stack would decide nothing
    tracker = ProgressTracker(floor=5)
    tracker.observe(1.0, {0: agent(marker=1)}, {0: host(1.0, cpu=99.0)})   # nothing to compare
    for t in range(2, 20):
        tracker.observe(float(t), {0: agent(marker=t)}, {0: host(float(t), cpu=99.0)})
        assert tracker.stacks_due(float(t)) == [], t
        assert tracker.work()[0].reason == "progress markers moved"
    # WHEN the markers stop, the next tick asks for the stack that now decides
    tracker.observe(20.0, {0: agent(marker=19)}, {0: host(20.0, cpu=99.0)})
    assert tracker.stacks_due(20.0) == [0]
    assert tracker.work()[0].verdict == "pending"


def test_busy_in_a_working_frame_is_work_and_starts_the_livelock_clock(tmp_path):
    tracker = ProgressTracker(floor=5)
    source = tmp_path / "model.py"
    source.write_text("def forward(x):\n    return x @ x\n")
    run(tracker, 2, r0={"cpu": 99.0})
    for t in range(2, 32):                  # sampled whenever the tracker says it is due
        if 0 in tracker.stacks_due(float(t)):
            tracker.stack_seen(0, stacks(0, "forward", str(source), 2, active=True), float(t))
        assert run(tracker, 1, start=t + 1, r0={"cpu": 99.0}) == []
    work = tracker.work()[0]
    assert work.working and work.stack_kind == "working" and work.frame.startswith("forward (")
    assert work.busy_unchanged >= 27


def test_cpu_spinning_in_a_wait_is_not_work(tmp_path):
    # a rank spinning at 100 % CPU in `loss.item()` (a CUDA sync) while the others wait
    source = tmp_path / "train.py"
    source.write_text("def train_step(loss):\n    return loss.item()\n")
    tracker = ProgressTracker(floor=5)
    run(tracker, 1, r0={"cpu": 100.0}, r1={})
    tracker.stack_seen(0, stacks(0, "train_step", str(source), 2, active=True), 1.0)
    [stall] = run(tracker, 10, start=2, r0={"cpu": 100.0}, r1={})
    assert stall.work[0].reason == "CPU busy spinning while waiting: cuda sync"


def test_a_stall_ends_on_work_not_on_a_pending_verdict():
    tracker = ProgressTracker(floor=5)
    [stall] = run(tracker, 8, r0={}, r1={})
    tracker.observe(9.0, {}, {0: host(9.0, 0, cpu=90.0), 1: host(9.0, 1)})
    assert tracker.check(9.0) == (None, None)             # busy, not classified: still a stall
    tracker.observe(10.0, {}, {0: host(10.0, 0, io=1e6), 1: host(10.0, 1)})
    _, ended = tracker.check(10.0)
    assert ended is not None and ended.id == stall.id and ended.ended_at == 10.0


def test_markers_moving_are_progress():
    tracker = ProgressTracker(floor=5)
    for t in range(1, 20):
        tracker.observe(float(t), {0: agent(t)}, {0: host(float(t))})
        assert tracker.check(float(t)) == (None, None)
    assert tracker.work()[0].reason == "progress markers moved"


def test_threshold_rises_for_a_phase_seen_to_take_long():
    tracker = ProgressTracker(floor=5)
    slow = (PhaseRecord("save", 0.0, 20.0),)
    tracker.observe(20.0, {0: agent(3, "save", slow)}, {})
    assert tracker.threshold() == 40.0
    assert tracker.check(50.0)[0] is None
    assert tracker.check(61.0)[0] is not None


def test_a_quiet_spell_that_ended_by_itself_raises_the_threshold_of_its_phase():
    tracker = ProgressTracker(floor=5)
    tracker.observe(0.0, {0: agent(1, "reward")}, {0: host(0.0)})
    assert tracker.check(6.0)[0] is not None                     # 6 s waiting on a server
    tracker.observe(12.0, {0: agent(2, "reward")}, {0: host(12.0)})
    assert tracker.check(12.0)[1] is not None                    # ... then it answered
    assert tracker.threshold() == 24.0                           # 2 x the 12 s spell


def test_a_logged_step_is_progress_for_every_live_rank():
    tracker = ProgressTracker(floor=5.0)
    tracker.observe(0.0, {}, {0: host(0.0, 0), 1: host(0.0, 1)})
    tracker.mark_dead(1)
    tracker.job_progressed(4.0)
    assert tracker.last_progress() == {0: 4.0, 1: 0.0}
    assert tracker.check(8.0) == (None, None)     # 4 s since the logged step, under the floor


def test_a_stopped_rank_is_idle_even_with_cpu():
    tracker = ProgressTracker(floor=5)
    [stall] = run(tracker, 8, r0={"cpu": 50.0, "status": "stopped"})
    assert stall.work[0].reason == "stopped (SIGSTOP)"


def test_gpu_busy_counts_only_in_a_working_stack(tmp_path):
    # NCCL kernels keep a GPU at 100 % while the rank waits in a collective: not work
    source = tmp_path / "train.py"
    source.write_text("def step(model, x):\n    return model(x)\n")
    tracker = ProgressTracker(floor=5)
    tracker.observe(1.0, {}, {0: host(1.0)}, {0: 100})
    assert tracker.work()[0].verdict == "pending"
    waiting = RankStacks(0, 100, 1.0, "py-spy", (ThreadStack(100, "MainThread", False, False, (
        Frame("all_reduce", "/x/site-packages/torch/distributed/distributed_c10d.py", 3252),
        Frame("step", str(source), 2))),))
    tracker.stack_seen(0, waiting, 1.5)
    tracker.observe(2.0, {}, {0: host(2.0)}, {0: 100})
    assert tracker.work()[0].reason == "GPU busy spinning while waiting: collective"
    tracker.stack_seen(0, stacks(0, "step", str(source), 2, active=True), 2.5)
    tracker.observe(3.0, {}, {0: host(3.0)}, {0: 97})
    assert tracker.work()[0].working and tracker.work()[0].gpu_util == 97


def test_cuda_markers_completing_are_progress():
    from stalldoc.model.agent import CudaState

    def with_gpu_marker(done: int) -> AgentSnapshot:
        cuda = CudaState(None, None, None, None, None, 0.0, 9, done, "", "", 0.0, 0.0)
        return AgentSnapshot(1, 0, 0, 1, 0, 0.0, 0.0, 3, 0.0, None, (), "", 0, (), (), cuda)

    tracker = ProgressTracker(floor=5)
    for t in range(1, 20):    # the host sits in one marker; the GPU works through the queue
        tracker.observe(float(t), {0: with_gpu_marker(t)}, {0: host(float(t))})
        assert tracker.check(float(t)) == (None, None)
    assert tracker.work()[0].reason == "progress markers moved"


def test_cpu_burnt_by_native_threads_while_python_threads_block_is_not_a_stall(tmp_path):
    # a rank finishing under heavy load: its main thread blocked joining threads (py-spy: idle)
    # while native teardown burns 41 % CPU; seen in a full-suite run with both cores busy
    source = tmp_path / "train.py"
    source.write_text("def main(pool):\n    pool.join()\n")
    tracker = ProgressTracker(floor=5)
    run(tracker, 1, r0={"cpu": 41.0})
    tracker.stack_seen(0, stacks(0, "main", str(source), 2, active=False), 1.0)
    assert run(tracker, 10, start=2, r0={"cpu": 41.0}) == []
    assert tracker.work()[0].reason == "CPU busy in native code while its Python threads wait"


# Ranks on an oversubscribed core (measured here, 2 ranks among 16 spinners on one CPU): one in a
# matmul loop used 4-6 % of a core and waited for it 180-200 % (several threads runnable); one
# waiting in all_reduce used 0 % and queued 16 % (its threads' wakeups).
def test_a_rank_starved_of_cpu_in_a_working_frame_is_working(tmp_path):
    source = tmp_path / "eval.py"
    source.write_text("def evaluate_retrieval(a, b):\n    return a @ b\n")
    tracker = ProgressTracker(floor=3)
    run(tracker, 1, r0={"cpu": 4.0, "wait": 190.0}, r1={"cpu": 6.0, "wait": 185.0})
    assert tracker.stacks_due(1.0) == [0, 1]             # busy: its stack decides
    for rank in (0, 1):
        tracker.stack_seen(rank, stacks(rank, "evaluate_retrieval", str(source), 2, True), 1.0)
    assert run(tracker, 20, start=2, r0={"cpu": 4.0, "wait": 190.0},
               r1={"cpu": 6.0, "wait": 185.0}) == []
    work = tracker.work()[0]
    assert work.working and work.reason.startswith("runnable, waiting for a CPU 190% (ran 4%) in "
                                                   "evaluate_retrieval (")
    assert "cpu 4% (waiting for a CPU 190%)" in work.describe()


def test_a_starved_rank_in_a_wait_is_still_idle(tmp_path):
    # the same core, the rank queued 60 % (far above what a wait's wakeups queue) yet its stack
    # is in all_reduce: a stall with the others
    source = tmp_path / "train.py"
    source.write_text("import torch.distributed as dist\ndef step(t):\n    dist.all_reduce(t)\n")
    tracker = ProgressTracker(floor=3)
    run(tracker, 1, r0={"cpu": 2.0, "wait": 60.0}, r1={"cpu": 0.0, "wait": 16.0})
    assert tracker.stacks_due(1.0) == [0]
    tracker.stack_seen(0, stacks(0, "all_reduce", "/x/torch/distributed/distributed_c10d.py",
                                 3, True), 1.0)
    [stall] = run(tracker, 10, start=2, r0={"cpu": 2.0, "wait": 60.0},
                  r1={"cpu": 0.0, "wait": 16.0})
    assert stall.work[0].verdict == "idle" and stall.work[0].reason == (
        "runnable, waiting for a CPU 60% (ran 2%) while waiting: collective")
    assert stall.work[1].reason == "no CPU, I/O, GPU or progress"   # 16 %: wakeups, not work


def test_wakeups_of_a_waiting_rank_on_a_loaded_node_are_not_busy():
    tracker = ProgressTracker(floor=3)
    [stall] = run(tracker, 10, r0={"cpu": 0.0, "wait": 16.0}, r1={"cpu": 1.0, "wait": 30.0})
    assert tracker.stacks_due(10.0) == []                 # no stack needed to call them idle
    assert {w.verdict for w in stall.work.values()} == {"idle"}


def test_a_rank_waiting_for_its_starved_worker_processes_is_working():
    tracker = ProgressTracker(floor=3)
    assert run(tracker, 20, r0={"children": 2, "children_cpu": 4.0,
                                "children_wait": 170.0}) == []
    assert tracker.work()[0].reason == ("2 child process(es) at 4% CPU, waiting for a CPU 170%")


def test_ranks_waiting_for_a_rank_working_on_another_node_are_not_stalled():
    """Node 0's ranks only wait; node 1's watcher publishes that one of its ranks works (a
    shard that takes minutes to load): the job is slow, not stalled, until that work stops."""
    tracker = ProgressTracker(floor=5)
    started = []
    for t in range(1, 30):
        tracker.observe(float(t), {}, {r: host(float(t), r) for r in (0, 1)})
        elsewhere = float(t) - 1 if t < 20 else 19.0      # the remote rank works until t=19
        began, _ = tracker.check(float(t), elsewhere, t < 20)
        started += [began] if began else []
    [stall] = started
    assert stall.started_at == 19.0 and stall.detected_at == 25.0


def test_a_rank_working_on_another_node_ends_the_stall():
    tracker = ProgressTracker(floor=5)
    assert run(tracker, 8, r0={})
    tracker.observe(9.0, {}, {0: host(9.0)})
    assert tracker.check(9.0, 2.0, False) == (None, None)    # old work elsewhere: still stalled
    _, ended = tracker.check(10.0, 10.0, True)
    assert ended is not None and ended.ended_at == 10.0


# Stacks as py-spy reads a Ray worker (ray 2.60): the main thread in the task loop, and, under
# Ray Train, the training loop in a thread of its own.
RAY = "/venv/lib/python3.11/site-packages/ray/_private"
MAIN_LOOP = (Frame("Worker.main_loop", f"{RAY}/worker.py", 1069),
             Frame("<module>", f"{RAY}/workers/default_worker.py", 323))


def ray_worker(rank: int, training: tuple[Frame, ...] = ()) -> RankStacks:
    threads = [ThreadStack(100 + rank, "MainThread", False, False, MAIN_LOOP)]
    if training:
        threads.append(ThreadStack(900 + rank, "TrainingThread", False, False, training))
    return RankStacks(rank, 100 + rank, 0.0, "py-spy", tuple(threads))


IN_ALL_REDUCE = (Frame("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/"
                                     "distributed_c10d.py", 3252),
                 Frame("train_loop_per_worker", "/home/me/train.py", 59),
                 Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982))


def _quiet_ticks(tracker: ProgressTracker, ranks: dict[int, RankStacks], start: int,
                 seconds: int, executors: set[int]) -> list:
    """Quiet ticks, one a second; each rank's stack is taken when the tracker asks for it."""
    started = []
    for t in range(start, start + seconds):
        tracker.observe(float(t), {}, {r: host(float(t), r) for r in ranks})
        for rank in tracker.stacks_due(float(t), executors):
            tracker.stack_seen(rank, ranks[rank], float(t))
        began, _ = tracker.check(float(t))
        started += [began] if began else []
    return started


def test_ray_workers_idle_between_tasks_are_no_stall():
    # GIVEN three Ray Train workers whose training loops ended: their main threads idle in Ray's
    # task loop while the driver winds the run down (quiet for far past the floor)
    tracker = ProgressTracker(floor=3)
    workers = {r: ray_worker(r) for r in range(3)}
    # THEN they are asked for stacks while quiet, seen between tasks, and no stall starts
    assert _quiet_ticks(tracker, workers, 1, 30, executors={0, 1, 2}) == []
    assert tracker.between_tasks(30.0) == {0, 1, 2}


def test_without_their_stacks_quiet_workers_are_a_stall():
    # GIVEN the same quiet workers, not known as task executors: nobody looks at their stacks
    tracker = ProgressTracker(floor=3)
    assert len(_quiet_ticks(tracker, {r: ray_worker(r) for r in range(3)}, 1, 30,
                            executors=set())) == 1


def test_a_rank_stuck_in_its_task_is_a_stall_while_the_others_are_between_tasks():
    # GIVEN verl's two groups: the actor ranks in their task (one waits in all_reduce in its
    # training thread, one blocked in its own code), the rollout ranks between tasks
    tracker = ProgressTracker(floor=3)
    stuck = (Frame("load_shard", "/home/me/train.py", 36),) + IN_ALL_REDUCE[1:]
    ranks = {0: ray_worker(0), 1: ray_worker(1), 2: ray_worker(2, IN_ALL_REDUCE),
             3: ray_worker(3, stuck)}
    [stall] = _quiet_ticks(tracker, ranks, 1, 30, executors={0, 1, 2, 3})
    # THEN the stall is declared, for all four, with the ranks in their task not between tasks
    assert stall.ranks == (0, 1, 2, 3)
    assert tracker.between_tasks(stall.detected_at) == {0, 1}


def test_a_worker_starved_between_tasks_as_the_others_end_is_no_stall():
    # GIVEN Ray workers between tasks at the end of a run on a loaded node (CI, two worlds on
    # 2 cores beside a CPU burner): rank 0 turns runnable, waiting for a CPU 75% of the time, its
    # stack is taken once (still Ray's task loop) and the next one does not come in time, while
    # ranks 1 and 2 are being torn down
    tracker = ProgressTracker(floor=3)
    workers = {r: ray_worker(r) for r in range(3)}
    assert _quiet_ticks(tracker, workers, 1, 10, executors={0, 1, 2}) == []
    tracker.observe(11.0, {}, {0: host(11.0, 0, cpu=2.0, wait=75.0)})
    assert tracker.stacks_due(11.0, {0, 1, 2}) == [0]
    tracker.stack_seen(0, workers[0], 11.0)
    started = []
    for t in range(12, 30):
        tracker.observe(float(t), {}, {0: host(float(t), 0, cpu=2.0, wait=75.0)},
                        ending={1, 2})
        began, _ = tracker.check(float(t))
        started += [began] if began else []
    # THEN its verdict rests on that stack, and so does its place between tasks: no stall
    assert tracker.work()[0].reason == (
        "runnable, waiting for a CPU 75% (ran 2%) while waiting: next task")
    assert started == [] and tracker.between_tasks(29.0) == {0}


def _ending_ticks(tracker: ProgressTracker, quiet: set[int], ending: set[int], start: int,
                  seconds: int) -> list:
    """A tick a second: the ``quiet`` ranks sampled idle, the ``ending`` ones (zombies whose
    threads are still torn down) without a host sample, as the host probe gives none."""
    started = []
    for t in range(start, start + seconds):
        tracker.observe(float(t), {}, {r: host(float(t), r) for r in quiet}, ending=ending)
        began, _ = tracker.check(float(t))
        started += [began] if began else []
    return started


def test_the_last_rank_ending_decides_no_stall():
    # GIVEN Ray Train's three workers quiet at the end of a run, floor 3 s; ranks 1 and 2 have
    # exited, rank 0 is torn down for 20 s on a loaded node (a zombie until its last thread goes)
    tracker = ProgressTracker(floor=3)
    assert _ending_ticks(tracker, {0, 1, 2}, set(), 1, 2) == []
    tracker.mark_dead(1)
    tracker.mark_dead(2)
    # THEN no stall while it ends, and its verdict says why
    assert _ending_ticks(tracker, set(), {0}, 3, 20) == []
    assert tracker.work()[0].reason == "exiting for 19 s (its process is ending)"
    assert tracker.ending(22.0) == {0}


def test_a_rank_stuck_in_its_exit_is_a_stall_after_the_grace():
    # GIVEN the same last rank, its exit never done (a thread stuck in the kernel)
    tracker = ProgressTracker(floor=3)
    _ending_ticks(tracker, {0}, set(), 1, 2)
    # THEN the stall starts once it has been ending for longer than ENDING_GRACE
    [stall] = _ending_ticks(tracker, set(), {0}, 3, 40)
    assert stall.detected_at == 3 + ENDING_GRACE + 1
    assert stall.work[0].reason.startswith("exiting for 31 s")


def test_ranks_waiting_on_a_rank_that_is_ending_are_a_stall():
    # GIVEN rank 2 crashed (its process is ending) while ranks 0 and 1 wait for it in a
    # collective: they decide, as ever
    tracker = ProgressTracker(floor=3)
    _ending_ticks(tracker, {0, 1, 2}, set(), 1, 2)
    [stall] = _ending_ticks(tracker, {0, 1}, {2}, 3, 10)
    assert stall.detected_at == 5.0 and stall.ranks == (0, 1, 2)   # quiet since 1 s, floor 3 s


def _serving(tracker: ProgressTracker, first: int, last: int, awaiting: set[int]) -> list:
    """Quiet ticks of a server rank (0) from ``first`` to ``last``; ``awaiting``: the ticks at
    which its engine waits for requests. Returns the stalls that started."""
    started = []
    for t in range(first, last + 1):
        tracker.observe(float(t), {}, {0: host(float(t), 0, cpu=0.3)})
        began, _ = tracker.check(float(t), awaiting={0} if t in awaiting else set())
        started += [began] if began else []
    return started


def test_a_server_whose_engine_waits_for_requests_is_no_stall():
    # GIVEN a vLLM server nobody sends a request to: its process idles far past the floor
    tracker = ProgressTracker(floor=5)
    # THEN no stall starts while its engine waits for requests
    assert _serving(tracker, 1, 120, awaiting=set(range(1, 121))) == []


def test_a_servers_stall_clock_starts_when_a_request_comes():
    # GIVEN a server idle for two minutes, then a request its engine never answers
    tracker = ProgressTracker(floor=5)
    assert _serving(tracker, 1, 120, awaiting=set(range(1, 121))) == []
    # THEN the request's first seconds are no stall (its idle minutes do not count) ...
    assert _serving(tracker, 121, 125, awaiting=set()) == []
    # ... and the stall starts once the floor passed with the request unanswered
    [stall] = _serving(tracker, 126, 130, awaiting=set())
    assert stall.detected_at == 126.0 and stall.started_at == 120.0
    assert tracker.last_progress()[0] == 120.0   # its time without progress counts from there


def test_a_job_with_no_rank_known_is_stalled_on_its_driver_and_actors_alone():
    # a Ray driver that joined a cluster started apart: no rank is known; the driver's part
    # says since when nothing of the job worked (None: something works, or was not read)
    tracker = ProgressTracker(floor=10.0)
    assert tracker.check(5.0) == (None, None)                      # nothing to judge
    assert tracker.check(30.0, outside_quiet=25.0) == (None, None)  # quiet 5 s: under 10
    began, _ = tracker.check(40.0, outside_quiet=25.0)
    assert began is not None and began.ranks == () and began.outside
    assert began.started_at == 25.0 and began.detected_at == 40.0
    assert tracker.check(45.0, outside_quiet=25.0) == (None, None)  # still stalled
    tracker.job_progressed(46.0)                                    # the driver works again
    _, ended = tracker.check(47.0)
    assert ended is not None and ended.id == began.id and ended.ended_at == 47.0


def test_a_job_whose_ranks_all_ended_is_not_stalled_by_what_is_left():
    tracker = ProgressTracker(floor=10.0)
    tracker.observe(0.0, {}, {0: host(0.0, 0)})
    tracker.mark_dead(0)
    assert tracker.check(60.0, outside_quiet=1.0) == (None, None)
