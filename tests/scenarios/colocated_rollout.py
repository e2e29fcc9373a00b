"""A GRPO-style trainer with vLLM colocated in every rank, as TRL's and swift's
``vllm_mode colocate`` run it: each rank (started by torchrun, gloo) builds its own engine with
``distributed_executor_backend="external_launcher"`` (vLLM's world is the job's, a TP group is a
block of consecutive ranks, and no engine process of its own is started), generates a group of
completions for its own prompts, scores them with a rule reward, and the ranks average their
rewards (all_reduce) before the next step.

The prompts are dealt to the ranks from one list (``prompts[rank::world]``); a rank whose share
has run out has nothing to roll out and goes straight to the reward's all_reduce. With a list
the ranks' count does not divide and a TP size above 1 (the engine's forward passes then need
every rank of its TP group), the other rank of its group waits in its engine for it.

Each step ends with the policy's update: a small network's forward and backward on the step's
rewards, its gradients averaged over the ranks (as DDP does).

With BACKEND ``mp`` (vLLM's own multiprocessing executor) each rank's engine is instead an
engine core and TP workers of its own, processes below the rank, as colocated engines were
started before external_launcher (swift's ``num_infer_workers``, one engine per rank): each
worker polls its queue between steps, and on a small node the engines take the cores the
training needs.

With DP above 1 each rank's engine is one data-parallel replica of one engine
(``data_parallel_size``, as verl and swift set it for a rollout of DP x TP ranks): between its
steps an engine asks its DP peers whether any of them has requests left (an all_reduce on the DP
group), so every DP rank must be in ``generate`` as often as the others; a rank whose share has
run out waits in the reward's all_reduce instead, and the other in its engine.

argv: MODEL STEPS TP PROMPTS [BACKEND [DP]]"""
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    from vllm import LLM, SamplingParams

    model, steps, tp, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    backend = sys.argv[5] if len(sys.argv) > 5 else "external_launcher"
    dp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True,
              seed=rank // tp, tensor_parallel_size=tp, data_parallel_size=dp,
              distributed_executor_backend=backend, gpu_memory_utilization=0.3)
    params = SamplingParams(n=4, max_tokens=16, temperature=1.0)
    prompts = [f"What is {11 + i} + {27 + 2 * i}?" for i in range(count)]
    mine = prompts[rank::world]
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                 torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3)
    for step in range(steps):
        started = time.monotonic()
        batch = mine[step:step + 1]
        texts = []
        if batch:
            outputs = llm.generate(batch, params, use_tqdm=False)
            texts = [c.text for o in outputs for c in o.outputs]
        reward = torch.tensor([sum(any(ch.isdigit() for ch in t) for t in texts) / 4])
        dist.all_reduce(reward)
        generated = time.monotonic()
        update(policy, optimizer, reward.item() / world)
        if rank == 0:
            print(f"train step {step}: mean reward {reward.item() / world:.2f}, "
                  f"{time.monotonic() - started:.2f} s (update {time.monotonic() - generated:.2f}"
                  " s)", flush=True)
    dist.destroy_process_group()


def update(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, reward: float) -> None:
    """The policy's step: forward and backward on a batch, gradients averaged over the ranks."""
    loss = -(policy(torch.randn(64, 256)).mean() * reward)
    optimizer.zero_grad()
    loss.backward()
    for param in policy.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    optimizer.step()


if __name__ == "__main__":
    main()
