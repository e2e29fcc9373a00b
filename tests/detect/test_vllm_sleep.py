"""vLLM engines' sleep state from their own log lines only (the wordings of
vllm/v1/executor/abstract.py, with and without the worker process prefix)."""
from __future__ import annotations

from stalldoc.detect.vllm_sleep import SleepLog, engine_of
from stalldoc.model.samples import LogLine

CORE = "(EngineCore_DP0 pid=4123) INFO 11-23 19:50:16 [abstract.py:231] "


def lines(*texts: tuple[float, str]) -> list[LogLine]:
    return [LogLine(t, "stdout", text) for t, text in texts]


def test_asleep_and_never_woken_from_the_engine_core_line():
    log = SleepLog()
    log.feed(lines((10.0, "[rank0]: loss 1.2"),
                   (11.0, CORE + "It took 0.512 seconds to fall asleep.")))
    [state] = log.states()
    assert (state.engine, state.state, state.asleep_at, state.woken_at) == (
        "EngineCore_DP0 pid=4123", "asleep", 11.0, None)
    assert (state.source, state.sleeps, state.wakes, state.level) == ("log", 1, 0, None)


def test_woken_for_weights_only_then_for_the_kv_cache():
    log = SleepLog()
    log.feed(lines((1.0, CORE + "It took 0.5 seconds to fall asleep."),
                   (2.0, CORE + "It took 0.2 seconds to wake up tags ['weights'].")))
    [state] = log.states()
    assert (state.state, state.woken_tags, state.woken_at) == ("partly awake", ("weights",), 2.0)
    log.feed(lines((3.0, CORE + "It took 0.1 seconds to wake up tags ['kv_cache'].")))
    assert log.states()[0].state == "awake" and not log.states()[0].asleep


def test_a_wake_up_without_tags_and_the_older_wording_wake_everything():
    log = SleepLog()
    old = "INFO 05-01 10:00:00 executor_base.py:208] "
    log.feed(lines((1.0, old + "It took 0.7 seconds to fall asleep."),
                   (2.0, old + "It took 0.8 seconds to wake up."),
                   (3.0, "It took 0.3 seconds to fall asleep."),
                   (4.0, "It took 0.3 seconds to wake up tags {'weights', 'kv_cache'}.")))
    [state] = log.states()
    assert (state.engine, state.state, state.sleeps, state.wakes) == ("vLLM engine", "awake", 2, 2)


def test_engines_are_told_apart_and_a_new_sleep_forgets_the_last_wake():
    other = "(EngineCore_DP1 pid=4124) INFO 11-23 19:50:16 [abstract.py:231] "
    log = SleepLog()
    log.feed(lines((1.0, CORE + "It took 0.5 seconds to fall asleep."),
                   (1.5, other + "It took 0.5 seconds to fall asleep."),
                   (2.0, CORE + "It took 0.2 seconds to wake up tags None."),
                   (5.0, other + "It took 0.2 seconds to wake up tags None."),
                   (6.0, other + "It took 0.4 seconds to fall asleep.")))
    states = {s.engine: s for s in log.states()}
    assert states["EngineCore_DP0 pid=4123"].state == "awake"
    assert (states["EngineCore_DP1 pid=4124"].state, states["EngineCore_DP1 pid=4124"].woken_at,
            states["EngineCore_DP1 pid=4124"].asleep_at) == ("asleep", 5.0, 6.0)


def test_a_wake_up_of_an_engine_never_seen_asleep_and_other_lines_are_ignored():
    log = SleepLog()
    log.feed(lines((1.0, "It took 0.2 seconds to wake up tags None."),
                   (2.0, "It took 3 s to load the model"), (3.0, "fall asleep")))
    assert log.states() == ()
    assert engine_of("(VllmWorker TP1 pid=77) It took 1 seconds") == "VllmWorker TP1 pid=77"
    assert engine_of("[default1]:INFO 11-23 19:50:16 [abstract.py:231] It took") == "[default1]"


def test_the_launchers_rank_prefix_names_the_local_rank():
    log = SleepLog()
    log.feed(lines((1.0, "[default1]:INFO 11-23 19:50:16 [abstract.py:231] It took 0.5 seconds "
                         "to fall asleep."), (2.0, CORE + "It took 0.5 seconds to fall asleep.")))
    assert {s.engine: s.local_rank for s in log.states()} == {"[default1]": 1,
                                                              "EngineCore_DP0 pid=4123": None}
