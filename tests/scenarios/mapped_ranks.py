"""A training script for srun / mpirun that maps the launcher's variables to torch's itself, as
MMEngine, detectron2 and many cluster scripts do (``os.environ["RANK"] = SLURM_PROCID``), then
``init_process_group("gloo")`` from the environment. Trains a small model with an all_reduce per
step; with STUCK_RANK set, that rank blocks at STUCK_STEP in STUCK_FUNC (default
``read_batch``) while the others wait in the all_reduce."""
import os
import threading
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "6"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))


def init_dist_from_launcher():
    if "SLURM_PROCID" in os.environ:
        rank, local, size = "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"
    elif "OMPI_COMM_WORLD_RANK" in os.environ:
        rank, local, size = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_SIZE")
    else:
        rank, local, size = "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"
    os.environ["RANK"] = os.environ[rank]
    os.environ["LOCAL_RANK"] = os.environ[local]
    os.environ["WORLD_SIZE"] = os.environ[size]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo")


def _stuck():
    threading.Event().wait()


def main():
    init_dist_from_launcher()
    rank = dist.get_rank()
    name = os.environ.get("STUCK_FUNC", "read_batch")
    stuck = type(_stuck)(_stuck.__code__.replace(co_name=name, co_qualname=name), globals())
    model = torch.nn.Linear(8, 8)
    for step in range(STEPS):
        if rank == STUCK_RANK and step == STUCK_STEP:
            stuck()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(STEP_SECONDS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
