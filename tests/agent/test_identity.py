"""Which rank a process is, as its agent learns it: from RANK or a launcher's variable at start,
and from the process group the process creates (real processes under the real agent)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.state_reader import StateFileError, read_claim
from stalldoc.run.inject import agent_environment
from stalldoc.model.ranks import RankClaim
from support import free_port

_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
                   "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                   "MPI_LOCALRANKID", "MV2_COMM_WORLD_RANK", "MASTER_ADDR", "MASTER_PORT")


def claim_of(tmp_path: Path, code: str, **variables: str) -> RankClaim | None:
    """Run ``code`` in a Python process with the agent and ``variables`` (and no other rank
    variable); the rank its agent claims once it has finished."""
    base = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    (tmp_path / "run").mkdir(exist_ok=True)
    env = agent_environment(tmp_path / "run", {**base, **variables}, os.getpid())
    out = subprocess.run([sys.executable, "-c", code + "\nimport os; print(os.getpid())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = out.stdout.split()[-1]
    return read_claim(str(tmp_path / "run" / "agents" / f"agent-{pid}.state"))


@pytest.mark.parametrize("variables,expected", [
    ({}, None),
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, RankClaim("RANK", 3, 1, 4)),
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"},
     RankClaim("SLURM_PROCID", 5, 1, 8)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_SIZE": "3"}, RankClaim("OMPI_COMM_WORLD_RANK", 2, 0, 3)),
    ({"PMI_RANK": "7", "PMI_SIZE": "16", "MPI_LOCALRANKID": "3"}, RankClaim("PMI_RANK", 7, 3, 16)),
    ({"PMIX_RANK": "1"}, RankClaim("PMIX_RANK", 1)),
    ({"MV2_COMM_WORLD_RANK": "4"}, RankClaim("MV2_COMM_WORLD_RANK", 4)),
    # torch's own variable first: srun + torchrun gives each rank both
    ({"RANK": "6", "SLURM_PROCID": "0"}, RankClaim("RANK", 6)),
    # a value that is no rank is no claim; the next launcher's is taken
    ({"RANK": "first", "SLURM_PROCID": "1"}, RankClaim("SLURM_PROCID", 1)),
    ({"SLURM_PROCID": "-1"}, None),
])
def test_claim_at_start_from_the_environment(tmp_path, variables, expected):
    assert claim_of(tmp_path, "pass", **variables) == expected


INIT = """
import os, torch.distributed as dist
dist.init_process_group("gloo", rank={rank}, world_size=1, init_method="tcp://127.0.0.1:{port}")
"""


def test_process_group_claim_replaces_the_environment_and_names_its_world(tmp_path):
    # GIVEN a Slurm task (SLURM_PROCID=4) that joins a one-rank world as its rank 0 by tcp://
    port = free_port()
    claim = claim_of(tmp_path, INIT.format(rank=0, port=port), SLURM_PROCID="4",
                     SLURM_LOCALID="2")
    # THEN the process group's rank is claimed, with the store's address as its world
    assert claim == RankClaim("process group", 0, 2, 1, f"127.0.0.1:{port}")


def test_a_script_that_sets_rank_itself_is_known_once_it_initializes(tmp_path):
    # GIVEN a script that sets RANK / WORLD_SIZE / MASTER_* itself (MMEngine, detectron2)
    port = free_port()
    code = (f"import os\nos.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='localhost', "
            f"MASTER_PORT='{port}', LOCAL_RANK='0')\n"
            "import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    assert claim_of(tmp_path, code) == RankClaim("process group", 0, 0, 1, f"localhost:{port}")


def test_the_latest_default_group_is_claimed(tmp_path):
    # GIVEN a process that leaves one world and joins another (an elastic re-init)
    first, second = free_port(), free_port()
    code = (INIT.format(rank=0, port=first) + "dist.destroy_process_group()\n"
            + f"dist.init_process_group('gloo', 'tcp://127.0.0.1:{second}', rank=0, "
            "world_size=1)\n")
    assert claim_of(tmp_path, code).world == f"127.0.0.1:{second}"


def test_init_device_mesh_is_seen_although_it_bound_torch_function_early(tmp_path):
    # GIVEN FSDP2's entry: init_device_mesh makes the default group with the function it
    # imported before the agent could wrap torch.distributed, and no collective follows
    port = free_port()
    code = ("from torch.distributed.device_mesh import init_device_mesh\n"
            "init_device_mesh('cpu', (1,))\n")
    claim = claim_of(tmp_path, code, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), SLURM_PROCID="9")
    assert claim == RankClaim("process group", 0, None, 1, f"127.0.0.1:{port}")


def test_a_failed_init_leaves_the_claim_and_the_job_error_alone(tmp_path):
    # GIVEN an init_process_group that raises (world_size 0): the job sees torch's own error
    code = ("import torch.distributed as dist\ntry:\n"
            "    dist.init_process_group('gloo', 'tcp://127.0.0.1:1', rank=0, world_size=0)\n"
            "except ValueError as exc:\n    print('job saw', type(exc).__name__)\n")
    assert claim_of(tmp_path, code, RANK="2") == RankClaim("RANK", 2)


def test_long_world_names_stay_apart_and_damaged_claims_are_refused(tmp_path):
    from stalldoc.agent.identity import world_name
    a, b = (world_name(f"file:/shared/checkpoints/run-{n}/rendezvous/store") for n in (1, 2))
    assert a != b and len(a) == len(b) == statefile.CLAIM_WORLD_SIZE
    path = str(tmp_path / "agent-1.state")
    writer = statefile.StateWriter(path, 1, -1, -1, -1, 0.0)
    writer.claim(len(statefile.CLAIM_SOURCES), 0, -1, -1, b"")   # no such source
    with pytest.raises(StateFileError, match="rank claim"):
        read_claim(path)


# a module of vLLM's that creates its engine's world, as vllm.distributed.parallel_state does
# (the code runs under that module's name: its frames are vLLM's)
ENGINE_INIT = """
import torch.distributed as dist
engine_module = {{"__name__": "vllm.distributed.parallel_state", "dist": dist}}
exec('''def init_distributed_environment(rank, method):
    dist.init_process_group("gloo", rank=rank, world_size=1, init_method=method)
''', engine_module)
engine_module["init_distributed_environment"](0, "{method}")
"""


def test_a_world_vllm_creates_for_its_engine_is_no_rank_claim(tmp_path):
    # GIVEN an engine worker (RANK=1 inherited from the torchrun rank that started its engine)
    # whose default group vLLM's code creates at an address of its own
    port = free_port()
    claim = claim_of(tmp_path, ENGINE_INIT.format(method=f"tcp://127.0.0.1:{port}"), RANK="1")
    # THEN it claims the engine's world: the process is an engine's worker, not rank 1
    assert claim == RankClaim("vLLM engine", 0, None, 1, f"127.0.0.1:{port}")


def test_vllm_joining_the_ranks_own_world_leaves_the_rank_claim(tmp_path):
    # GIVEN vLLM inside a training rank (external_launcher): its code creates the default group
    # from the rank's environment (env://)
    port = free_port()
    claim = claim_of(tmp_path, ENGINE_INIT.format(method="env://"), RANK="0", WORLD_SIZE="1",
                     LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # THEN the process is the job's rank, known from its process group
    assert claim == RankClaim("process group", 0, 0, 1, f"127.0.0.1:{port}")
