"""A tiny random Qwen2 and a byte-level BPE tokenizer trained here, offline, plus the arithmetic
prompts the RL jobs train on. Built once under ~/.cache/stallbench/ (a file lock keeps two ranks
from building it at the same time). Head size 64 (hidden 128, 2 heads): vLLM's CPU attention
needs 64 or more, so the same model serves TRL, swift, vLLM and Ray jobs.

Run it alone to build the model and print its path: ``python tinymodel.py``.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "MODELSCOPE_OFFLINE": "1", "USE_HF": "1", "CUDA_VISIBLE_DEVICES": "",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
CACHE = Path(os.environ.get("STALLBENCH_CACHE", Path.home() / ".cache" / "stallbench"))
MODEL_DIR = CACHE / "rl-qwen2-h128"


def offline() -> None:
    """Set the offline environment (no hub, no GPU) unless the caller set it already."""
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)


def questions(count: int) -> list[dict]:
    """Chat prompts ``What is a + b?`` with the boxed answer as ``solution``."""
    rows = []
    for i in range(count):
        a, b = 11 + i, 27 + 2 * i
        question = f"What is {a} + {b}? Put the answer in \\boxed{{}}."
        rows.append({"messages": [{"role": "user", "content": question}],
                     "solution": f"<answer>\\boxed{{{a + b}}}</answer>"})
    return rows


def _build(directory: Path, hidden: int, heads: int, layers: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [r["messages"][0]["content"] + " " + r["solution"] for r in questions(200)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)


def build_model(directory: Path = MODEL_DIR, hidden: int = 128, heads: int = 2,
                layers: int = 2) -> Path:
    """Build the model once (atomic: built in a temporary folder, then renamed)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "model.safetensors").exists():
            temporary = directory.with_name(directory.name + f".tmp{os.getpid()}")
            temporary.mkdir()
            _build(temporary, hidden, heads, layers)
            temporary.rename(directory)
    return directory


def write_dataset(path: Path, count: int) -> Path:
    """The prompts as JSONL (swift's ``--dataset`` format)."""
    path.write_text("".join(json.dumps(row) + "\n" for row in questions(count)))
    return path


if __name__ == "__main__":
    offline()
    print(build_model())
