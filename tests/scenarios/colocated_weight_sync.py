"""A GRPO loop with vLLM colocated in the rank, written as vLLM's RL examples and hand-rolled
trainers write it: the rank holds the policy (a Hugging Face model) and a vLLM engine of the same
model (``distributed_executor_backend="external_launcher"``, started by torchrun); each step it
generates a group of completions per prompt, scores them with a rule reward, takes a policy
gradient step on the completions' log-probabilities, and sends the new weights to its engine
with vLLM's in-place reload (``collective_rpc("reload_weights")``).

SYNC says how the weights go: ``tensor`` one call per parameter, as TRL pushes them one by one
(``_push_param_to_vllm``) and OpenRLHF broadcast them before chunking; ``bucket`` all of them
in one call, as swift's flattened buckets do. A model of many small tensors (a MoE's experts,
here many thin layers) makes the first crawl: each call pays the engine's reload once.

argv: MODEL STEPS; in the environment SYNC (``tensor`` or ``bucket``), MAX_TOKENS (8: a
completion's length) and PROMPTS (1: prompts a step, one group of completions each, one group
trained on): longer completions for more prompts make the generation most of a step"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    model_dir, steps, sync = sys.argv[1], int(sys.argv[2]), os.environ.get("SYNC", "bucket")
    prompts = int(os.environ.get("PROMPTS", "1"))
    dist.init_process_group("gloo")
    llm = LLM(model=model_dir, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              distributed_executor_backend="external_launcher", gpu_memory_utilization=0.3)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3)
    params = SamplingParams(n=4, max_tokens=int(os.environ.get("MAX_TOKENS", "8")),
                            temperature=1.0, ignore_eos="MAX_TOKENS" in os.environ)
    for step in range(steps):
        started = time.monotonic()
        prompt, texts, rewards = rollout(llm, params, step, prompts)
        train(policy, optimizer, tokenizer, prompt, texts, rewards)
        synced = time.monotonic()
        send_weights(llm, policy, sync)
        print(f"step {step}: {time.monotonic() - started:.2f} s, weight sync "
              f"{time.monotonic() - synced:.2f} s", flush=True)


def rollout(llm, params, step: int, prompts: int) -> tuple[str, list[str], torch.Tensor]:
    """A group of completions for each of ``prompts`` prompts, scored; the group kept for
    training is the first whose rewards differ (DAPO's dynamic sampling drops the groups that
    carry no signal), else the first."""
    asked = [f"What is {11 + step + k} + {27 + 2 * step}?" for k in range(prompts)]
    groups = []
    for k, out in enumerate(llm.generate(asked, params, use_tqdm=False)):
        texts = [c.text for c in out.outputs]
        rewards = torch.tensor([float(str(38 + 3 * step + k) in t) for t in texts])
        groups.append((asked[k], texts, rewards))
    return next((g for g in groups if g[2].std() > 0), groups[0])


def train(policy, optimizer, tokenizer, prompt: str, texts: list[str],
          rewards: torch.Tensor) -> None:
    """One policy-gradient step: the completions' log-probabilities weighted by their
    advantages (rewards less the group's mean)."""
    advantages = rewards - rewards.mean()
    batch = tokenizer([prompt + t for t in texts], return_tensors="pt", padding=True)
    logits = policy(**batch).logits[:, :-1]
    logps = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    loss = -(logps.mean(-1) * advantages).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def send_weights(llm, policy, sync: str) -> None:
    weights = [(name, p.detach()) for name, p in policy.state_dict().items()]
    if sync == "tensor":
        for one in weights:
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [one]})
    else:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})


if __name__ == "__main__":
    main()
