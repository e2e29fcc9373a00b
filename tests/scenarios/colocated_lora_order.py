"""GRPO in colocate mode with a LoRA adapter and a tensor-parallel rollout engine inside the ranks
(huggingface/trl#3671: with ``vllm_tensor_parallel_size=2`` and PEFT the ranks hang at
``llm.generate``). Each step syncs the weights into the engine: a rank merges its adapter,
gathers the merged weights over the world (an all_reduce stands in for ZeRO-3's gather) and
unmerges, then the TP group generates (its engine's all-reduce on the TP group, ranks 2k and
2k+1). At STEP, rank 0 finds its adapter still marked merged from a failed earlier sync and skips
the sync: it goes straight into generate's TP all-reduce, while every other rank sits in the
world's gather. Rank 0 waits for rank 1 in the TP group, rank 1 for rank 0 in the world.

Environment: STEP (default 2)."""
import os

import torch
import torch.distributed as dist


class Engine:
    """A colocated engine's TP shard: generate runs an all-reduce on its TP group."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.weights = torch.zeros(256)

    def generate(self, prompts: torch.Tensor) -> torch.Tensor:
        hidden = prompts @ torch.ones(prompts.shape[1], 256) + self.weights
        dist.all_reduce(hidden, group=self.group)
        return hidden.argmax(dim=1)


def sync_weights(adapter: torch.Tensor, engine: Engine, merged: bool) -> None:
    """Merge the adapter, gather the merged weights over every rank, load them, unmerge."""
    if merged:
        return   # "already merged": the flag a failed sync left set
    full = adapter.clone()
    dist.all_reduce(full)
    engine.weights = full / dist.get_world_size()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([k, k + 1]) for k in range(0, world, 2)]
    engine = Engine(groups[rank // 2])
    adapter = torch.randn(256)
    stuck = int(os.environ.get("STEP", "2"))
    for step in range(stuck + 3):
        sync_weights(adapter, engine, merged=rank == 0 and step == stuck)
        tokens = engine.generate(torch.randn(4, 8))
        adapter -= 1e-3 * tokens.float().mean()
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
