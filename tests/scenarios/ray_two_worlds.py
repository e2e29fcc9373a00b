"""Two torch.distributed worlds in one Ray job, the way verl lays out an RL job, without verl:
plain Ray actors (``@ray.remote class Worker``) in two groups, "actor" (ACTOR_RANKS ranks,
default 2) and "rollout" (ROLLOUT_RANKS ranks, default 2). As verl's ``RayWorkerGroup`` does, the
driver gives each actor its rank through ``runtime_env={"env_vars": {...}}`` (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, WG_PREFIX), so they are in the worker
process's environment from its start, and the worker calls
``torch.distributed.init_process_group("gloo")`` with the ``env://`` default. Each group has its
own MASTER_PORT (ACTOR_PORT / ROLLOUT_PORT when given, else a free one), so the job holds two
gloo worlds whose ranks both run 0..N-1.

Started as ``python ray_two_worlds.py``: ``ray.init()`` starts a local cluster, or joins the one
at RAY_ADDRESS (started apart with ``ray start``). For each of
STEPS steps (default 4) the driver, like verl's trainer, first has the rollout group generate
(each rank an all_gather of its samples), then the actor group update (a backward and an
all_reduce of the gradients). Each rank prints ``<group> rank R step S``. With STUCK_GROUP
(``actor`` or ``rollout``) and STUCK_RANK set, that rank of that group blocks for good at step
STUCK_STEP (default 1) in a function named STUCK_FUNC (default ``load_shard``): its group's other
ranks wait in the collective, the other group sits idle between calls, and the driver waits in
``ray.get``. With STUCK_HOW=killed that rank is instead killed there (SIGKILL, as the OOM
killer ends a worker): its actor is dead, and the driver's ``ray.get`` fails. A healthy run ends
with exit status 0."""
import os
import signal
import socket
import threading
import types

import ray

ACTOR_RANKS = int(os.environ.get("ACTOR_RANKS", "2"))
ROLLOUT_RANKS = int(os.environ.get("ROLLOUT_RANKS", "2"))
STEPS = int(os.environ.get("STEPS", "4"))
STUCK_GROUP = os.environ.get("STUCK_GROUP", "")
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "1"))
STUCK_FUNC = os.environ.get("STUCK_FUNC", "load_shard")
STUCK_HOW = os.environ.get("STUCK_HOW", "hang")   # or "killed": SIGKILL, as the OOM killer does


def load_shard() -> None:
    """Where the stuck rank stops: waits on an event nobody sets."""
    threading.Event().wait()


def _named(name: str):
    """``load_shard`` under the name ``name`` (its code object renamed, as py-spy and
    ``sys._current_frames`` show it; file and line numbers stay this file's)."""
    code = load_shard.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, globals(), name)


@ray.remote(num_cpus=1)
class Worker:
    """One rank of one group; its rank and rendezvous come from its environment (verl's way)."""

    def __init__(self, group: str, stuck: dict) -> None:
        import torch
        import torch.distributed as dist

        self.group = group
        self.rank = int(os.environ["RANK"])
        self.stuck = stuck
        dist.init_process_group("gloo")     # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        torch.manual_seed(self.rank)
        self.model = torch.nn.Linear(16, 4)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def _enter(self, step: int) -> None:
        print(f"{self.group} rank {self.rank} step {step}", flush=True)
        if (self.group == self.stuck["group"] and self.rank == self.stuck["rank"]
                and step == self.stuck["step"]):
            if self.stuck["how"] == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            _named(self.stuck["func"])()

    def generate_sequences(self, step: int) -> int:
        import torch
        import torch.distributed as dist

        self._enter(step)
        with torch.no_grad():
            samples = self.model(torch.randn(8, 16)).argmax(dim=-1)
        gathered = [torch.empty_like(samples) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, samples)
        return int(torch.cat(gathered).numel())

    def update_actor(self, step: int) -> float:
        import torch
        import torch.distributed as dist

        self._enter(step)
        loss = self.model(torch.randn(8, 16)).square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        for param in self.model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        self.optimizer.step()
        return loss.item()

    def shutdown(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()
        if os.environ.get("EXIT_1_AT_SHUTDOWN"):   # as Ray's workers often end when the
            threading.Timer(0.2, os._exit, (1,)).start()   # driver shuts down: status 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_group(prefix: str, world_size: int, stuck: dict) -> list:
    """verl's ``RayWorkerGroup``: one named actor per rank, its rank in its env_vars."""
    master_port = int(os.environ.get(f"{prefix.upper()}_PORT") or free_port())
    workers = []
    for rank in range(world_size):
        env_vars = {"WG_PREFIX": prefix, "RANK": str(rank), "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}
        workers.append(Worker.options(name=f"{prefix}_{rank}",
                                      runtime_env={"env_vars": env_vars}).remote(prefix, stuck))
    return workers


def main() -> None:
    if os.environ.get("RAY_ADDRESS"):   # a cluster started apart (`ray start`): join it
        ray.init()
    else:
        ray.init(num_cpus=ACTOR_RANKS + ROLLOUT_RANKS, include_dashboard=False)
    stuck = {"group": STUCK_GROUP, "rank": STUCK_RANK, "step": STUCK_STEP, "func": STUCK_FUNC,
             "how": STUCK_HOW}
    try:
        rollout = make_group("rollout", ROLLOUT_RANKS, stuck)
        actor = make_group("actor", ACTOR_RANKS, stuck)
        for step in range(STEPS):
            samples = ray.get([w.generate_sequences.remote(step) for w in rollout])
            losses = ray.get([w.update_actor.remote(step) for w in actor])
            print(f"driver step {step} samples {samples[0]} loss {losses[0]:.4f}", flush=True)
        ray.get([w.shutdown.remote() for w in rollout + actor])
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
