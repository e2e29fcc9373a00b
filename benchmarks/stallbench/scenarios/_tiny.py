"""The tiny model the vLLM scenarios share (not a scenario: the loader skips ``_`` files): a
random 2-layer Qwen2 and a byte-level BPE tokenizer, built once under ~/.cache/stallbench."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def tiny_model() -> str:
    """A random 2-layer Qwen2 and a byte-level BPE tokenizer (head size 128: vLLM CPU attention)."""
    where = Path.home() / ".cache" / "stallbench" / "qwen2-h128-vllm"
    if (where / "config.json").exists():
        return str(where)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    where.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=where.parent))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [f"What is {11 + i} + {27 + 2 * i}? The answer is {38 + 3 * i}." for i in range(200)],
        trainers.BpeTrainer(vocab_size=512,
                            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(build)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id)).save_pretrained(build)
    try:
        os.rename(build, where)
    except OSError:
        pass
    return str(where)
