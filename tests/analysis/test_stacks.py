"""Reading stacks: which source lines take a lock."""
from __future__ import annotations

from stalldoc.analysis.stacks import (handling, is_lock_line, waits_in_engine_dp_sync,
                                      waits_on_http)
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack


def test_a_lock_line_is_code_that_takes_a_lock_not_a_word_in_a_comment():
    """A job script's `with open(shard) as fh:  # blocks here on a stuck mount` was read as a
    lock (SD104) because "blocks" holds "lock"."""
    taking = ["with self._lock:", "    with cache_lock:", "with threading.Lock():",
              "lk.acquire()", "async with self.sem:", "with cond:"]
    not_taking = ["with open(p) as fh:  # blocks here", "with self._blocking_io():",
                  "x = 1  # lock.acquire(", "with clock_source():"]
    assert [is_lock_line(t) for t in taking] == [True] * len(taking)
    assert [is_lock_line(t) for t in not_taking] == [False] * len(not_taking)



def _thread(*files: str) -> ThreadStack:
    frames = tuple(Frame("f", name, 1) for name in files) + (Frame("rollout", "/job/t.py", 9),)
    return ThreadStack(1, "MainThread", False, False, frames)


def test_only_a_plain_http_client_is_a_wait_on_http():
    lib = "/usr/lib/python3.11"
    assert waits_on_http(_thread(f"{lib}/socket.py", f"{lib}/http/client.py"))
    assert waits_on_http(_thread(f"{lib}/socket.py", "/venv/site-packages/httpx/_client.py"))
    # TLS, gRPC and a raw socket: their server is not asked for /metrics over plain HTTP
    assert not waits_on_http(_thread(f"{lib}/ssl.py", f"{lib}/http/client.py"))
    assert not waits_on_http(_thread("/venv/site-packages/grpc/_channel.py"))
    assert not waits_on_http(_thread(f"{lib}/socket.py"))


SITE = "/venv/lib/python3.11/site-packages"
SGL = f"{SITE}/sglang/srt"
DP_ATTN = f"{SGL}/managers/scheduler_components/dp_attn.py"
# an SGLang scheduler of DP attention at its batch exchange before a forward (frames and lines
# of SGLang 0.5.23's source: two DP ranks, so the all-gather itself, on gloo)
SGLANG_DP_EXCHANGE = (
    Frame("all_gather_into_tensor", f"{SITE}/torch/distributed/distributed_c10d.py", 4170),
    Frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    Frame("exchange_sync_rows", DP_ATTN, 70),
    Frame("MLPSyncBatchInfo.all_gather", DP_ATTN, 260),
    Frame("prepare_mlp_sync_batch_raw", DP_ATTN, 649),
    Frame("SchedulerDPAttnAdapter.prepare_mlp_sync_batch", DP_ATTN, 747),
    Frame("SchedulerDPAttnAdapter.maybe_prepare_mlp_sync_batch", DP_ATTN, 774),
    Frame("Scheduler.get_next_batch_to_run", f"{SGL}/managers/scheduler.py", 4008),
    Frame("Scheduler.event_loop_normal", f"{SGL}/managers/scheduler.py", 2039))


def test_an_engines_data_parallel_sync_is_known_by_its_frame_inside_a_collective():
    found = waits_in_engine_dp_sync(ThreadStack(1, "MainThread", False, False,
                                                SGLANG_DP_EXCHANGE))
    assert found is not None and found[0].name == "SGLang", found
    assert found[1] == SGLANG_DP_EXCHANGE[2]
    # the same functions running, not waiting in a collective (the batch being built)
    assert waits_in_engine_dp_sync(ThreadStack(1, "MainThread", True, True,
                                               SGLANG_DP_EXCHANGE[4:])) is None
    # a collective the scheduler makes elsewhere (its TP group's broadcast of requests)
    elsewhere = (SGLANG_DP_EXCHANGE[0],
                 Frame("GroupCoordinator.broadcast_object", f"{SGL}/distributed/parallel_state.py",
                       1490),
                 Frame("Scheduler.recv_requests", f"{SGL}/managers/scheduler.py", 1700))
    assert waits_in_engine_dp_sync(ThreadStack(1, "MainThread", False, False, elsewhere)) is None
    assert waits_in_engine_dp_sync(None) is None


# a FastAPI server under uvicorn as py-spy reads it: the main thread in its event loop, an idle
# thread of anyio's pool, and one handling a request in a plain def endpoint
LIB = "/usr/lib/python3.11"
EVENT_LOOP = ThreadStack(10, "MainThread", False, False, (
    Frame("EpollSelector.select", f"{LIB}/selectors.py", 468),
    Frame("BaseEventLoop._run_once", f"{LIB}/asyncio/base_events.py", 1898),
    Frame("run", f"{SITE}/uvicorn/main.py", 579),
    Frame("serve", "/job/reward.py", 70)))
IDLE_WORKER = ThreadStack(11, "AnyIO worker thread", False, False, (
    Frame("Condition.wait", f"{LIB}/threading.py", 327),
    Frame("Queue.get", f"{LIB}/queue.py", 171),
    Frame("WorkerThread.run", f"{SITE}/anyio/_backends/_asyncio.py", 967)))
HANDLING = ThreadStack(12, "AnyIO worker thread", False, False, (
    Frame("Condition.wait", f"{LIB}/threading.py", 327),
    Frame("serve.<locals>.wait_for_batch.<locals>.<listcomp>", "/job/reward.py", 52),
    Frame("serve.<locals>.wait_for_batch", "/job/reward.py", 52),
    Frame("serve.<locals>.score_texts", "/job/reward.py", 66),
    Frame("run_sync_in_worker_thread", f"{SITE}/anyio/to_thread.py", 56),
    Frame("WorkerThread.run", f"{SITE}/anyio/_backends/_asyncio.py", 986)))


def test_a_server_handling_a_request_is_read_at_the_thread_that_handles_it():
    # (at its function's frame, not the comprehension's inside it)
    stacks = RankStacks(-7, 7, 0.0, "py-spy", (EVENT_LOOP, IDLE_WORKER, HANDLING))
    thread, frame, wait = handling(stacks)
    assert (thread.thread_id, str(frame), wait) == (
        12, "serve.<locals>.wait_for_batch (/job/reward.py:52)", "lock")


def test_a_server_between_requests_handles_none():
    assert handling(RankStacks(-7, 7, 0.0, "py-spy", (EVENT_LOOP, IDLE_WORKER))) is None
