"""Healthy: local rank 0 builds and tokenizes the dataset while the other rank waits (main_process_first)

source: https://github.com/mosaicml/llm-foundry/pull/716
shape: an accelerate fine-tuning script under torchrun (2 CPU ranks, gloo) that prepares its
  data inside `with accelerator.main_process_first():` : load_dataset("text") on the raw
  support-ticket dump, then Dataset.map(tokenize, num_proc=2) and a group_texts packing map;
  rank 0 works for a minute or two while rank 1 waits in the barrier inside main_process_first,
  then loads the cached arrow files in seconds, and both train. Slow, not stuck
launch: torchrun 2
truth: healthy
needs: torch, accelerate, datasets, tokenizers
budget: 170
"""
import random
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from datasets import load_dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import jobkit

WORDS = ("customer support ticket refund order shipping delay damaged package replacement account "
         "password reset invoice billing error subscription cancel upgrade warranty repair thanks "
         "please urgent again still waiting hello agent escalate manager").split()
BLOCK = 128
DATA = Path("data").resolve()


def dump_raw_tickets(path: Path, count: int = 560_000) -> None:
    rng = random.Random(0)
    with open(path, "w") as out:
        for _ in range(count):
            out.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 70))) + "\n")


def build_tokenizer(path: Path) -> Tokenizer:
    if not path.exists():
        sample = path.with_name("raw_tickets.txt").read_text().splitlines()[:3000]
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.train_from_iterator(sample, trainers.BpeTrainer(
            vocab_size=512, special_tokens=["[UNK]", "[EOS]"]))
        tokenizer.save(str(path))
    return Tokenizer.from_file(str(path))


def prepare_dataset(accelerator: Accelerator):
    DATA.mkdir(exist_ok=True)
    raw_path = DATA / "raw_tickets.txt"
    if accelerator.is_local_main_process and not raw_path.exists():
        dump_raw_tickets(raw_path)
    tokenizer = build_tokenizer(DATA / "tokenizer.json")
    eos = tokenizer.token_to_id("[EOS]")

    def tokenize(batch):
        return {"input_ids": [e.ids + [eos] for e in tokenizer.encode_batch(batch["text"])]}

    def group_texts(batch):
        flat = [token for ids in batch["input_ids"] for token in ids]
        usable = len(flat) // BLOCK * BLOCK
        return {"input_ids": [flat[i:i + BLOCK] for i in range(0, usable, BLOCK)]}

    raw = load_dataset("text", data_files=str(raw_path), cache_dir=str(DATA / "cache"))["train"]
    tokenized = raw.map(tokenize, batched=True, num_proc=2, remove_columns=["text"])
    return tokenized.map(group_texts, batched=True, num_proc=2)


def main() -> None:
    jobkit.init()
    accelerator = Accelerator(cpu=True)
    if accelerator.is_local_main_process:
        jobkit.hang_begins("local rank 0 prepares the dataset; rank 1 waits in main_process_first")
    with accelerator.main_process_first():
        blocks = prepare_dataset(accelerator)
    accelerator.print(f"{len(blocks)} blocks of {BLOCK} tokens")
    blocks.set_format("torch")
    model = torch.nn.Sequential(torch.nn.Embedding(512, 32), torch.nn.Linear(32, 512))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(blocks, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        ids = batch["input_ids"]
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        jobkit.step(step)
        if step == 20:
            break
        time.sleep(0.1)
    accelerator.print(f"loss {loss.item():.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
