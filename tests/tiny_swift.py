"""A tiny Qwen2 model, a tokenizer trained here, and a math dataset: enough for real `swift rlhf`
GRPO runs on CPU in seconds (recipe in ../shared/notes/swift.md). Built once per test session."""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "MODELSCOPE_OFFLINE": "1", "USE_HF": "1", "CUDA_VISIBLE_DEVICES": "",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def questions(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        a, b = 11 + i, 27 + 2 * i
        rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}? Put the answer "
                                                              "in \\boxed{}."}],
                     "solution": f"<answer>\\boxed{{{a + b}}}</answer>"})
    return rows


def build_model(directory: Path, hidden: int = 64, heads: int = 4, layers: int = 2) -> Path:
    """Random Qwen2 (hidden 64, 2 layers) and a byte-level BPE tokenizer, saved for swift. vLLM's
    CPU attention needs a head size of 64 or more: ``hidden=128, heads=2``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
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
                         num_key_value_heads=heads // 2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def write_dataset(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in questions(count)))
    return path


def swift_argv(model: Path, data: Path, out: Path, *extra: str,
               rewards: tuple[str, ...] = ("accuracy", "format")) -> list[str]:
    swift = str(Path(sys.executable).parent / "swift")
    return [swift, "rlhf", "--rlhf_type", "grpo", "--model", str(model), "--model_type", "qwen2",
            "--template", "qwen", "--dataset", str(data), "--reward_funcs", *rewards,
            "--tuner_type", "full", "--torch_dtype", "float32", "--max_completion_length", "16",
            "--use_vllm", "false", "--report_to", "none", "--logging_steps", "1",
            "--save_strategy", "no", "--dataloader_num_workers", "0", "--dataset_num_proc", "1",
            "--check_model", "false", "--use_cpu", "true", "--output_dir", str(out), *extra]


def swift_env(nproc: int = 1) -> dict[str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **OFFLINE, "MASTER_PORT": str(port)}
    if nproc > 1:
        env["NPROC_PER_NODE"] = str(nproc)
    return env
