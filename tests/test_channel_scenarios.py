"""Weight-sync, rollout and vLLM sleep hangs under a real ``stalldoc watch``: real torchrun ranks,
real TRL / swift clients against a local server that never answers, a stand-in vLLM (it needs a
GPU) whose engine was put to sleep and never woken."""
from __future__ import annotations

import os
import socket

import pytest

from support import STAND_INS, silent_rollout_server, torchrun


def _with_vllm(env: dict[str, str]) -> dict[str, str]:
    path = [p for p in (os.environ.get("PYTHONPATH"), str(STAND_INS)) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


@pytest.mark.parametrize("client,nproc,wait_rank,phase,method", [
    ("trl", 2, 1, "weight_sync", "update_named_param"),
    ("swift-infer", 3, 2, "rollout_server", "infer"),
])
def test_rank_hung_in_a_server_call_is_named_with_method_and_server(
        run_watch, client, nproc, wait_rank, phase, method):
    # GIVEN a rollout server that answers its health check and never the request
    with silent_rollout_server() as port:
        env = _with_vllm({"CLIENT": client, "WAIT_RANK": str(wait_rank),
                          "SERVER_PORT": str(port)})
        # WHEN rank WAIT_RANK calls it through the real TRL / swift client under watch
        result = run_watch(torchrun(nproc, "channel_client.py"), "--on-stall", "kill", env=env)
    assert result.code == 124, result.stderr
    # THEN SD111 names the rank, the phase, the method and the server
    [finding] = result.findings("SD111")
    assert finding["ranks"] == [wait_rank]
    assert finding["summary"].startswith(
        f"rank {wait_rank} in {phase}: {method}, server 127.0.0.1:{port}, "), finding["summary"]
    evidence = finding["evidence"]
    assert (evidence["channel"], evidence["method"], evidence["endpoint"]) == (
        phase, method, f"127.0.0.1:{port}")
    assert evidence["seconds_in_call"] > 0
    assert "--vllm_server_host" in finding["fix"]
    assert not [f for f in result.findings("SD107") if wait_rank in f["ranks"]]   # said once


def test_weight_group_the_server_never_joins_is_named_with_the_group(run_watch):
    # GIVEN a server that accepts init_communicator and never joins the weight-update group
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        group_port = taken.getsockname()[1]
    with silent_rollout_server() as port:
        env = _with_vllm({"CLIENT": "swift-group", "WAIT_RANK": "0", "SERVER_PORT": str(port),
                          "GROUP_PORT": str(group_port)})
        # WHEN swift's VLLMClient.init_communicator meets it on rank 0
        result = run_watch(torchrun(2, "channel_client.py"), "--on-stall", "kill", env=env)
    assert result.code == 124, result.stderr
    # THEN the hang is named in the group's rendezvous, with the group's address
    [finding] = result.findings("SD111")
    assert finding["ranks"] == [0]
    assert finding["summary"].startswith(
        f"rank 0 in weight_sync: StatelessProcessGroup.create, group 127.0.0.1:{group_port} "
        "(rank 1 of 2), "), finding["summary"]
    assert "NCCL_DEBUG=INFO" in finding["fix"]


@pytest.mark.parametrize("nproc,wait_rank", [(2, 1)])
def test_engine_put_to_sleep_and_never_woken_is_named(run_watch, nproc, wait_rank):
    # GIVEN colocated vLLM engines put to sleep for each training step; rank WAIT_RANK skips
    # one wake-up and generates
    env = _with_vllm({"WAIT_RANK": str(wait_rank)})
    result = run_watch(torchrun(nproc, "vllm_never_woken.py"), "--on-stall", "kill", env=env)
    assert result.code == 124, result.stderr
    # THEN SD112 says when the engine was put to sleep and where the rank waits
    [finding] = result.findings("SD112")
    assert finding["ranks"] == [wait_rank]
    assert "and not woken since; " in finding["summary"]
    assert f"rank {wait_rank} waits in LLM.generate (from rollout (" in finding["summary"]
    evidence = finding["evidence"]
    assert (evidence["state"], evidence["source"], evidence["level"]) == ("asleep", "agent", 1)
    assert evidence["sleeps"] == evidence["wakes"] + 1 == 3


def test_engine_never_woken_is_named_from_its_log_lines_without_the_agent(run_watch):
    # GIVEN the same job without the agent: only the engines' own log lines, one per rank
    # (torchrun --tee prefixes them), tell that they slept
    command = torchrun(2, "vllm_never_woken.py")
    command[3:3] = ["--tee", "3"]
    result = run_watch(command, "--no-agent", "--on-stall", "kill",
                       env=_with_vllm({"WAIT_RANK": "0"}))
    assert result.code == 124, result.stderr
    # THEN SD112 names the engine of the rank that waits in vLLM's generate
    [finding] = result.findings("SD112")
    assert finding["ranks"] == [0]
    assert finding["summary"].startswith("vLLM ([default0]) put to sleep at ")
    assert "rank 0 waits in LLM.generate" in finding["summary"]
    assert (finding["evidence"]["source"], finding["evidence"]["state"]) == ("log", "asleep")
