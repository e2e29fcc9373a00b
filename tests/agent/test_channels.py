"""Channel hooks and vLLM sleep state in a real agent-injected process importing the stand-in
vLLM (it needs a GPU): the call's detail while it runs (read back from the process's own state
file), an inner channel call of the same phase changing only the detail, a static method hooked,
sleep / wake_up recorded once per engine, credentials never written."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from stalldoc.agent import channels
from stalldoc.agent.state_reader import read_state
from stalldoc.run.inject import agent_environment
from support import STAND_INS

JOB = textwrap.dedent("""
    import os, threading, types
    import stalldoc
    from stalldoc.agent import statefile
    from stalldoc.agent.state_reader import read_state
    from vllm import LLM
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    PATH = statefile.state_path(os.environ["STALLDOC_AGENT_DIR"], os.getpid())
    seen = []

    class Store:                      # what the broadcast sees of its group's TCPStore
        host, port = "10.0.0.5", 51216
        def set(self, key, value):
            state = read_state(PATH)
            seen.append((state.phase_stack, state.channel and state.channel.describe()))

    comm = PyNcclCommunicator(types.SimpleNamespace(rank=0, world_size=2, store=Store()), 0)
    comm.broadcast(None, src=0)
    with stalldoc.phase("weight_sync"):          # swift's _move_model_to_vllm, say
        comm.broadcast(None, src=0)
    after = read_state(PATH)
    t = threading.Thread(target=comm.broadcast, args=(None, 0)); t.start(); t.join()
    StatelessProcessGroup.create(host="127.0.0.1", port=0, rank=0, world_size=1)
    llm = LLM("m", enable_sleep_mode=True)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    partly = read_state(PATH).engines
    llm.wake_up(tags=["kv_cache"])
    llm.sleep()
    print(seen, after.phase_detail, after.phase_stack, partly)
    print(os.getpid())
""")


def test_channel_details_static_methods_and_sleep_state(tmp_path):
    (tmp_path / "run").mkdir()
    env = agent_environment(tmp_path / "run", dict(os.environ), os.getpid())
    env["PYTHONPATH"] += os.pathsep + str(STAND_INS)
    out = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True,
                         check=True)
    seen, pid = out.stdout.splitlines()[-2:]
    group = "group 10.0.0.5:51216 (rank 0 of 2)"
    # the broadcast's detail while it runs: its own phase, then as the detail of the outer one
    assert seen.startswith(f"[(('weight_sync',), 'PyNcclCommunicator.broadcast, {group}'), "
                           f"(('weight_sync',), 'PyNcclCommunicator.broadcast, {group}'), "
                           "((), None)]"), seen      # the other thread's call: progress only
    assert " None () " in seen                 # after the outer phase: no detail, no phase
    assert "EngineSleepState(engine='engine 1', state='partly awake'" in seen
    state = read_state(str(tmp_path / "run" / "agents" / f"agent-{pid}.state"))
    # __init__, broadcast, the outer phase (its inner broadcast only changed the detail),
    # create; LLM.sleep calling LLMEngine.sleep is one phase
    assert [p.name for p in state.phases] == ["weight_sync"] * 4 + [
        "vllm_sleep", "vllm_wake_up", "vllm_wake_up", "vllm_sleep"]
    [engine] = state.engines
    assert (engine.state, engine.level, engine.sleeps, engine.wakes) == ("asleep", 1, 2, 2)
    assert engine.woken_tags == () and engine.woken_at < engine.asleep_at
    outcomes = (tmp_path / "run" / "agents" / f"hooks-{pid}.txt").read_text()
    assert "installed vllm.distributed.utils:StatelessProcessGroup.create -> weight_sync" \
        in outcomes
    assert "installed vllm.entrypoints.llm:LLM.wake_up -> vllm_wake_up" in outcomes


def test_endpoints_drop_credentials_and_paths():
    assert channels.netloc("https://user:s3cret@rm.example:8443/v1?key=x") == "rm.example:8443"
    assert channels.netloc("10.0.0.5:8000") == "10.0.0.5:8000"
    client = type("C", (), {"base_urls": ["http://a:1/", "http://tok@b:2"], "group_ports": [7, 8]})
    assert channels.swift_server("init_communicator", (client(),), {}) == (
        "init_communicator\tserver\ta:1, b:2 (group ports 7, 8)")
    assert channels.group_create("create", ("h", 5), {"rank": 1, "world_size": 2}) == (
        "StatelessProcessGroup.create\tgroup\th:5 (rank 1 of 2)")


def test_a_client_unlike_the_expected_one_costs_the_detail_not_the_agent(tmp_path, monkeypatch):
    """Another TRL version without ``group_port``: the call keeps its phase with the bare method
    name, and the agent stays on for everything else."""
    from stalldoc.agent import runtime

    class OldClient:                  # base_url, but no group_port
        base_url = "http://10.0.0.5:8000"

        def init_communicator(self) -> str:
            agent = runtime.current()
            assert agent is not None
            return agent.phases[-1][2]

    agent = runtime.Agent(str(tmp_path))
    monkeypatch.setattr(runtime, "_AGENT", agent)
    wrapped = channels.channel(channels.trl_server)(OldClient.init_communicator, "weight_sync")
    assert wrapped(OldClient()) == "init_communicator"
    assert agent.enabled and agent.phases == []
