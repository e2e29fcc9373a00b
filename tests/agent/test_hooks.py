"""Hooks by qualified name, in a real agent-injected process importing stand-in library modules
(vLLM and DeepSpeed's engine need a GPU here; swift's hooks run for real in the acceptance suite):
phases marked on the main thread, progress only elsewhere, missing names recorded, vLLM engine
settings written."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from stalldoc.agent.state_reader import read_state
from stalldoc.run.inject import agent_environment

ENGINE = textwrap.dedent("""
    import dataclasses, threading, time

    @dataclasses.dataclass
    class EngineArgs:
        gpu_memory_utilization: float = 0.5
        max_model_len: int = 2048
        tensor_parallel_size: int = 8
        enable_sleep_mode: bool = True
        def create_engine_config(self):
            return "config"

    class LLMEngine:
        def step(self):
            return []
        def sleep(self, level=1):
            time.sleep(0.05)
""")
JOB = textwrap.dedent("""
    import os, threading
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine
    EngineArgs().create_engine_config()
    engine = LLMEngine()
    engine.sleep()
    for _ in range(5):
        engine.step()
    t = threading.Thread(target=engine.sleep); t.start(); t.join()   # not the main thread
    print(os.getpid())
""")


def test_hooks_mark_phases_record_missing_names_and_engine_settings(tmp_path):
    package = tmp_path / "lib" / "vllm" / "engine"
    package.mkdir(parents=True)
    for init in (tmp_path / "lib" / "vllm" / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "arg_utils.py").write_text(ENGINE)
    (package / "llm_engine.py").write_text("from vllm.engine.arg_utils import LLMEngine\n")
    (tmp_path / "run").mkdir()
    env = agent_environment(tmp_path / "run", dict(os.environ), os.getpid())
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "lib")
    out = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True,
                         check=True)
    pid = out.stdout.split()[-1]
    agents = tmp_path / "run" / "agents"
    state = read_state(str(agents / f"agent-{pid}.state"))
    assert [p.name for p in state.phases] == ["vllm_sleep"]      # the main thread's call only
    assert state.marker_seq == 2 + 5 + 1                         # enter, exit, 5 steps, thread
    outcomes = (agents / f"hooks-{pid}.txt").read_text().splitlines()
    assert "installed vllm.engine.llm_engine:LLMEngine.step -> progress" in outcomes
    assert "missing vllm.engine.llm_engine:LLMEngine.wake_up" in outcomes
    assert "installed vllm.engine.arg_utils:EngineArgs.create_engine_config -> engine settings" \
        in outcomes
    settings = (agents / f"vllm-{pid}.json").read_text()
    assert '"gpu_memory_utilization": 0.5' in settings and '"tensor_parallel_size": 8' in settings


SERVER = textwrap.dedent("""
    import asyncio, os, socket, sys, threading
    import uvicorn

    SERVED = os.path.join(sys.argv[2], f"served-{os.getpid()}.txt")
    told_early = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":   # the app's start-up: before the server listens
            while (await receive())["type"] != "lifespan.shutdown":
                told_early.append(os.path.exists(SERVED))
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    def serve(sock):
        server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
        async def run():
            task = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started:
                await asyncio.sleep(0.02)
            server.should_exit = True
            await task
        asyncio.run(run())

    wildcard = socket.create_server(("0.0.0.0", 0))
    port = wildcard.getsockname()[1]
    if sys.argv[1] == "thread":   # a side server of a training process: not what it does
        side = threading.Thread(target=serve, args=(wildcard,)); side.start(); side.join()
    else:
        serve(wildcard)
    print(os.getpid(), port, any(told_early))
""")


def test_a_process_serving_http_on_its_main_thread_says_where(tmp_path):
    (tmp_path / "run").mkdir()
    env = agent_environment(tmp_path / "run", dict(os.environ), os.getpid())
    agents = tmp_path / "run" / "agents"
    for where in ("main", "thread"):
        # GIVEN uvicorn serving on the wildcard address, on the main thread or a side thread
        out = subprocess.run([sys.executable, "-c", SERVER, where, str(agents)], env=env,
                             capture_output=True, text=True, check=True, timeout=60)
        pid, port, told_early = out.stdout.split()
        served = agents / f"served-{pid}.txt"
        if where == "main":
            # THEN its agent wrote the URL it listens at, the wildcard as the loopback address
            assert served.read_text() == f"http://127.0.0.1:{port}\n"
            # once it listens: not while its app starts (a client told then is refused)
            assert told_early == "False"
            assert "installed uvicorn.server:Server.main_loop -> progress" in \
                (agents / f"hooks-{pid}.txt").read_text().splitlines()
        else:
            # AND a server on another thread is not the process's work: nothing written
            assert not served.exists()
