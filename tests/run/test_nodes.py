"""Which node this watcher is, from the launcher's flags or the environment, and its
subdirectory of the run directory the nodes' watchers share."""
from __future__ import annotations

import sys

import pytest

from stalldoc.errors import StalldocError
from stalldoc.run.nodes import NodeIdentity, node_identity
from stalldoc.run.options import make_node_run_dir

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.parametrize("argv, env, expected", [
    (["torchrun", "--nnodes", "4", "--node_rank", "2", "--nproc_per_node", "8", "train.py",
      "--node_rank", "9"], {}, NodeIdentity("node-2", 2, 4)),
    ([*TORCHRUN, "--nnodes=2", "--node-rank=1", "train.py"], {}, NodeIdentity("node-1", 1, 2)),
    (["accelerate", "launch", "--num_machines", "2", "--machine_rank", "1", "t.py"], {},
     NodeIdentity("node-1", 1, 2)),
    (["swift", "rlhf", "--rlhf_type", "grpo"], {"NNODES": "2", "NODE_RANK": "1"},
     NodeIdentity("node-1", 1, 2)),
    (["torchrun", "--nnodes", "2:4", "--rdzv_backend", "c10d", "train.py"], {},
     NodeIdentity("node-gpu-07.cluster", None, 4)),          # elastic: ranks come at run time
    (["srun", "python", "train.py"], {"SLURM_NODEID": "3", "SLURM_NNODES": "8"},
     NodeIdentity("node-3", 3, 8)),
    (["torchrun", "--nnodes", "2", "--node_rank", "5", "t.py"], {},
     NodeIdentity("node-gpu-07.cluster", None, 2)),          # not a node rank of 2 nodes
    (["torchrun", "--nproc_per_node", "8", "train.py"], {}, NodeIdentity("node-gpu-07.cluster",
                                                                         None, None)),
])
def test_the_node_comes_from_the_launcher_then_the_environment(argv, env, expected):
    found = node_identity(argv, env, "gpu-07.cluster")
    assert found == expected
    assert found.multi == (expected.count not in (None, 1) or bool(expected.index))


def test_a_host_name_is_made_safe_for_a_directory():
    assert node_identity(["torchrun", "--nnodes", "2", "t.py"], {}, "../../etc x").name \
        == "node-.._.._etc_x"
    assert NodeIdentity("node-gpu-07", None, 2).label == "node gpu-07"


def test_nodes_share_the_run_dir_and_two_watchers_cannot_be_one_node(tmp_path):
    shared = tmp_path / "grpo-run"
    zero, one = NodeIdentity("node-0", 0, 2), NodeIdentity("node-1", 1, 2)
    assert make_node_run_dir(shared, zero) == (shared / "node-0", shared)
    assert make_node_run_dir(shared, one) == (shared / "node-1", shared)  # not empty: shared
    (shared / "node-1" / "run.db").write_bytes(b"")
    with pytest.raises(StalldocError, match="not empty"):
        make_node_run_dir(shared, one)
    single, none = make_node_run_dir(tmp_path / "single", NodeIdentity("node-x", None, None))
    assert (single, none) == (tmp_path / "single", None)
    (single / "run.db").write_bytes(b"")              # a single node's run: not for nodes
    with pytest.raises(StalldocError, match="holds the run of a single node"):
        make_node_run_dir(single, zero)
