"""An RL job's rollout loop on a real vLLM engine (offline ``LLM``, as TRL's and swift's
colocated rollouts and many GRPO scripts use it): each step generates a group of completions per
prompt, scores them with a rule reward, and logs a line. vLLM starts its engine core and its
worker as processes of their own (spawned: hence the ``__main__`` guard).

argv: MODEL STEPS [TP [KV_BLOCKS MAX_TOKENS [PROMPTS]]] (the engine's tensor-parallel size, 1
by default: TP workers; PROMPTS a step, 2 by default). The engine's KV cache is
``VLLM_CPU_KVCACHE_SPACE`` GiB (the CPU counterpart of ``gpu_memory_utilization``; whole GiB,
thousands of blocks), or KV_BLOCKS blocks of 128 tokens (vLLM's ``num_gpu_blocks_override``): too
few for the rollout's completions of MAX_TOKENS (16 by default), and the engine preempts."""
import sys
import time


def reward(text: str) -> float:
    return 1.0 if any(ch.isdigit() for ch in text) else 0.0


def main() -> None:
    from vllm import LLM, SamplingParams

    model, steps = sys.argv[1], int(sys.argv[2])
    tp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    blocks, max_tokens = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (0, 16)
    # gpu_memory_utilization: on the CPU backend the share of the NUMA node's memory vLLM
    # requires free at start-up (0.92 by default: refused on a machine whose page cache holds
    # more than 8 % of it); the KV cache itself is VLLM_CPU_KVCACHE_SPACE
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              tensor_parallel_size=tp, gpu_memory_utilization=0.3,
              **({"num_gpu_blocks_override": blocks} if blocks else {}))
    params = SamplingParams(n=4, max_tokens=max_tokens, temperature=1.0, ignore_eos=blocks > 0)
    count = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    prompts = [f"What is {11 + i} + {27 + 2 * i}?" for i in range(count)]
    for step in range(steps):
        started = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        scores = [reward(c.text) for o in outputs for c in o.outputs]
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        print(f"rollout step {step}: {len(scores)} completions, {tokens} tokens, "
              f"mean reward {sum(scores) / len(scores):.2f}, "
              f"{time.monotonic() - started:.2f} s", flush=True)


if __name__ == "__main__":
    main()
