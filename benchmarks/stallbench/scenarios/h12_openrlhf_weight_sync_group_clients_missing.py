"""OpenRLHF GRPO on Ray: the actor-to-vLLM weight-sync group waits for a TP worker that never joins

source: https://github.com/OpenRLHF/OpenRLHF/issues/1040, https://github.com/OpenRLHF/OpenRLHF/issues/865
shape: train_ppo_ray with one vLLM engine of tensor_parallel_size 2: the driver sizes the
  model-update group as 1 + engines * tp_size = 3, actor rank 0 hosts it, but the engine brings
  up only one of its two workers (its second bundle is packed elsewhere), so rank 2 never comes
launch: python
truth: hang
culprit: engine
frame: init_model_update_group
cause: rendezvous_missing_node
needs: ray, torch
"""
import os
import socket

import ray
import torch
import torch.distributed as dist

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


class TinyCausalLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, 32))
        self.lm_head = torch.nn.Linear(32, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.mlp(self.embed(ids)))


@ray.remote(num_cpus=0.5)
class LLMRayActor:
    """A vLLM engine with tensor_parallel_size=2; only the worker of bundle 0 came up."""

    def __init__(self, tensor_parallel_size: int) -> None:
        jobkit.announce("engine")
        self.tp_size = tensor_parallel_size
        self.workers = [TinyCausalLM()]   # the second TP worker was never placed

    def generate(self, prompts: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.workers[0](prompts).argmax(-1)

    def init_model_update_group(self, master_address: str, master_port: int,
                                rank_offset: int, world_size: int) -> None:
        os.environ.update(MASTER_ADDR=master_address, MASTER_PORT=str(master_port))
        for worker_rank, _ in enumerate(self.workers):
            jobkit.hang_begins("the engine's only worker joins the model-update group of 3; "
                               "its second TP worker, rank 2, never will")
            jobkit.init(rank=rank_offset + worker_rank, world=world_size)


@ray.remote(num_cpus=0.5)
class ActorModelRayActor:
    """Actor (policy) rank 0, DeepSpeed on the real cluster; it hosts the model-update group."""

    def __init__(self) -> None:
        jobkit.announce("actor")
        self.model = TinyCausalLM()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5)

    def warmup(self, steps: int) -> float:
        for step in range(steps):   # the SFT-initialised policy's first local steps
            ids = torch.randint(0, 64, (4, 8))
            loss = torch.nn.functional.cross_entropy(self.model(ids[:, :-1]).flatten(0, 1),
                                                     ids[:, 1:].flatten())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            jobkit.step(step)
        return loss.item()

    def init_model_update_group(self, master_address: str, master_port: int,
                                world_size: int) -> None:
        os.environ.update(MASTER_ADDR=master_address, MASTER_PORT=str(master_port))
        jobkit.init(rank=0, world=world_size)

    def broadcast_to_vllm(self) -> None:
        for param in self.model.parameters():
            dist.broadcast(param.data, src=0)


def train_ppo_ray(vllm_num_engines: int = 1, vllm_tensor_parallel_size: int = 2) -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    actor = ActorModelRayActor.remote()
    engines = [LLMRayActor.remote(vllm_tensor_parallel_size) for _ in range(vllm_num_engines)]
    print("actor warmup loss", ray.get(actor.warmup.remote(10)), flush=True)
    print("engine smoke test", ray.get(engines[0].generate.remote(torch.zeros(1, 4).long())),
          flush=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        master_port = sock.getsockname()[1]
    world_size = vllm_num_engines * vllm_tensor_parallel_size + 1
    refs = [actor.init_model_update_group.remote("127.0.0.1", master_port, world_size)]
    refs += [engine.init_model_update_group.remote(
        "127.0.0.1", master_port, i * vllm_tensor_parallel_size + 1, world_size)
        for i, engine in enumerate(engines)]
    ray.get(refs)
    ray.get(actor.broadcast_to_vllm.remote())
    ray.shutdown()


if __name__ == "__main__":
    train_ppo_ray()
