"""A healthy TRL GRPO job on CPU, two ranks: ``GRPOTrainer`` on the tiny Qwen2 from tinymodel.py,
arithmetic prompts, two rewards (a format check and an accuracy check that is sometimes slow, as a
call to a reward model or a sandbox is: 5-40 s on rank 0 while rank 1 waits in the gather), a
rank-0 "evaluation" of 30-90 s after a minute and then every 150 s (rank 1 waits in the step's
all_reduce), and a time limit shared by both ranks (an all_reduce at every step end).

Run: ``RL_MINUTES=10 torchrun --nproc-per-node 2 trl_grpo.py`` (default 10 minutes); exits 0.
"""
from __future__ import annotations

import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinymodel  # noqa: E402

tinymodel.offline()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (TrainerCallback, TrainerControl, TrainerState,  # noqa: E402
                          TrainingArguments)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

MINUTES = float(os.environ.get("RL_MINUTES", "10"))
RANK = int(os.environ.get("RANK", "0"))
FIRST_EVAL_S, EVAL_EVERY_S = 60.0, 150.0


def format_reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """1.0 for a boxed answer, else the share of digits (a shaped reward with some spread)."""
    texts = [c[0]["content"] for c in completions]
    return [1.0 if "\\boxed{" in t else sum(ch.isdigit() for ch in t) / max(1, len(t))
            for t in texts]


def accuracy_reward(completions: list[list[dict[str, str]]], solution: list[str],
                    trainer_state: TrainerState | None = None, **kwargs: Any) -> list[float]:
    """1.0 for the right sum; on rank 0, one step in twenty waits 5-40 s like a remote judge."""
    step = trainer_state.global_step if trainer_state is not None else 0
    slow = random.Random(step)
    if RANK == 0 and slow.random() < 0.05:
        time.sleep(slow.uniform(5, 40))
    answers = [re.search(r"boxed\{(\d+)\}", s).group(1) for s in solution]
    return [1.0 if f"boxed{{{a}}}" in c[0]["content"] else 0.0
            for c, a in zip(completions, answers)]


def evaluate(model: torch.nn.Module, seconds: float) -> None:
    """A slow CPU evaluation on rank 0: forward passes over random batches for ``seconds``."""
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randint(0, 500, (8, 128)))


class Pace(TrainerCallback):
    """Stops every rank together once RL_MINUTES are up; now and then rank 0 evaluates alone."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MINUTES * 60
        self.next_eval = time.monotonic() + FIRST_EVAL_S
        self.evals = 0

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: torch.nn.Module | None = None, **kwargs: Any) -> TrainerControl:
        now = time.monotonic()
        seconds = min(random.Random(self.evals).uniform(30, 90), self.deadline - now - 15)
        if RANK == 0 and model is not None and now >= self.next_eval and seconds >= 30:
            self.evals += 1
            print(f"rank 0: evaluating alone for {seconds:.0f} s", flush=True)
            evaluate(model, seconds)
            self.next_eval = time.monotonic() + EVAL_EVERY_S
        stop = torch.tensor([1 if time.monotonic() >= self.deadline else 0])
        if dist.is_initialized():
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        control.should_training_stop = bool(stop.item())
        return control


def dataset() -> Dataset:
    rows = [{"prompt": r["messages"], "solution": r["solution"]} for r in tinymodel.questions(64)]
    return Dataset.from_list(rows)


def main() -> None:
    model = tinymodel.build_model()
    out = Path(os.environ.get("RL_OUT", "/tmp")) / f"trl-grpo-{os.getppid()}"
    config = GRPOConfig(output_dir=str(out), use_cpu=True, ddp_backend="gloo", use_vllm=False,
                        per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=24, max_steps=100000, learning_rate=1e-5,
                        logging_steps=1, save_strategy="no", report_to="none",
                        dataloader_num_workers=0, seed=0, bf16=False)
    trainer = GRPOTrainer(model=str(model), reward_funcs=[format_reward, accuracy_reward],
                          args=config, train_dataset=dataset(), callbacks=[Pace()])
    trainer.train()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {RANK}: done after {trainer.state.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
