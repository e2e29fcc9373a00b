from __future__ import annotations

from stalldoc.detect.progress_lines import ProgressLines


def test_swift_and_trainer_progress_lines():
    lines = ["Train: 3/6 {'loss': 0.1, 'global_step/max_steps': '3/6', 'elapsed_time': '2s'}",
             "It took 2.41 seconds to fall asleep.", "It took 0.93 seconds to wake up tags ['kv']",
             "Memory cleanup attempt 1",
             "{'loss': 1.3862, 'grad_norm': 0.52, 'learning_rate': 1e-05, 'epoch': 0.12}"]
    feed = ProgressLines()
    assert all(feed.is_progress(line) for line in lines)
    assert not feed.is_progress("max_steps: 6")


def test_a_bar_is_progress_only_when_its_count_goes_up():
    feed = ProgressLines()
    bar = "Map (num_proc=2):  {pct}%|####      | {n}/1000 [00:03<00:04, 130.20 examples/s]"
    assert not feed.is_progress(bar.format(pct=10, n=100))   # first sight: nothing to compare
    assert feed.is_progress(bar.format(pct=45, n=450))
    assert not feed.is_progress(bar.format(pct=45, n=450))   # a frozen bar redrawn
    other = "eval:  12%|#2        | 12/100 [00:10<01:13,  1.20it/s]"
    assert not feed.is_progress(other)                       # another bar starts its own count


def test_repeated_warnings_are_not_progress():
    feed = ProgressLines()
    line = ("(EngineCore pid=123) WARNING shm_broadcast.py:466] No available shared memory "
            "broadcast block found in 60 seconds.")
    assert not any(feed.is_progress(line) for _ in range(3))


def test_a_scripts_step_lines_are_counted_when_their_count_goes_up():
    feed = ProgressLines()
    assert not feed.is_counted("step 3 loss 2.31 (0.42 s)")    # first of its shape
    assert feed.is_counted("step 4 loss 2.27 (0.40 s)")
    assert not feed.is_counted("step 4 loss 2.27 (0.40 s)")    # the same step said again
    assert feed.is_counted("2026-11-28 08:40:01 | Epoch 1 | iter 1200 | lr 3e-4") is False
    assert feed.is_counted("2026-11-28 08:40:09 | Epoch 1 | iter 1250 | lr 3e-4")
    assert not feed.is_counted("2026-11-28 08:40:17 | Epoch 1 | iter 1250 | lr 3e-4")
    # an epoch's first step after the last of the one before: the counts in order
    assert not feed.is_counted("epoch 1 batch 99/100")
    assert feed.is_counted("epoch 2 batch 0/100")


def test_waits_and_retries_are_never_counted():
    feed = ProgressLines()
    lines = ["Waiting for the judge API at step 7 (attempt {n}, retry in 5 s)",
             "No available shared memory broadcast block found in {n}0 seconds.",
             "[E ProcessGroupGloo.cpp:144] Rank 0 still waiting after {n}0 s"]
    assert not any(feed.is_counted(line.format(n=n)) for line in lines for n in range(1, 5))
