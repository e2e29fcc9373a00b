"""What holds a process whose script returned, read from its threads' stacks (stacks as py-spy
gives them for such processes: the main thread in ``threading._shutdown``, or in an exit
handler with nothing of the script below it)."""
from __future__ import annotations

from stalldoc.analysis.shutdown import EXIT_HANDLER, THREADS, UNSEEN, held
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

PID = 4242
SHUTDOWN = Frame("_shutdown", "/usr/lib/python3.11/threading.py", 1590)
AGENT = ThreadStack(4243, None, False, False,
                    (Frame("Agent._beat", "/run/bootstrap/stalldoc/agent/runtime.py", 128),))


def thread(tid: int, name: str | None, *frames: Frame) -> ThreadStack:
    return ThreadStack(tid, name, False, False, frames)


def stacks(*threads: ThreadStack) -> RankStacks:
    return RankStacks(0, PID, 1.0, "py-spy", threads)


UPLOADER = thread(4250, "metrics-uploader",
                  Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
                  Frame("Queue.get", "/usr/lib/python3.11/queue.py", 171),
                  Frame("upload_metrics", "/home/me/train.py", 28),
                  Frame("Thread.run", "/usr/lib/python3.11/threading.py", 975))


def test_a_main_thread_in_shutdown_waits_for_the_one_thread_left_not_stalldocs():
    found = held(stacks(thread(PID, "MainThread", SHUTDOWN), AGENT, UPLOADER))
    assert found.kind == THREADS
    [holder] = found.holders
    assert (holder.thread, holder.frame) == ("metrics-uploader",
                                             Frame("upload_metrics", "/home/me/train.py", 28))


def test_several_threads_left_are_each_a_candidate():
    other = thread(4251, "pin_memory", Frame("_pin_memory_loop", "/home/me/loader.py", 50))
    found = held(stacks(thread(PID, "MainThread", SHUTDOWN), UPLOADER, other))
    assert [h.thread for h in found.holders] == ["metrics-uploader", "pin_memory"]


def test_a_main_thread_in_an_exit_handler_is_that_handler():
    handler = thread(PID, "MainThread",
                     Frame("wait", "/usr/lib/python3.11/threading.py", 629),
                     Frame("sync_checkpoints_to_bucket", "/home/me/train.py", 34))
    found = held(stacks(handler, AGENT))
    assert found.kind == EXIT_HANDLER
    assert found.holders[0].frame == Frame("sync_checkpoints_to_bucket", "/home/me/train.py", 34)


def test_no_stack_of_the_main_thread_tells_nothing():
    assert held(None).kind == UNSEEN
    assert held(stacks(AGENT, UPLOADER)).kind == UNSEEN    # the main thread not among them
