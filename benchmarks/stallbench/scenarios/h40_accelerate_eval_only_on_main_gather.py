"""Only the main process enters evaluation and gather_for_metrics; the other rank keeps training

source: https://github.com/huggingface/transformers/issues/31532, https://github.com/huggingface/accelerate/issues/2785
shape: an accelerate no_trainer script (Accelerator() under torchrun, 2 CPU ranks, gloo) whose
  "evaluate every N steps" test reads the tqdm progress bar, which exists only on the main
  process (disable=not accelerator.is_main_process); rank 0 runs evaluate() and waits in
  accelerator.gather_for_metrics while rank 1 goes on into the next step's gradient all-reduce
launch: torchrun 2
truth: hang
culprit: 0
frame: evaluate
cause: collective_mismatch
needs: torch, accelerate, tqdm
"""
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

import jobkit

EVAL_STEPS = 6


def evaluate(accelerator: Accelerator, model, eval_loader) -> float:
    model.eval()
    correct = total = 0
    for features, labels in eval_loader:
        with torch.no_grad():
            predictions = model(features).argmax(-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct += int((predictions == labels).sum())
        total += len(labels)
    model.train()
    return correct / max(total, 1)


def main() -> None:
    jobkit.init()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(512, 20), torch.randint(0, 3, (512,)))
    eval_set = TensorDataset(torch.randn(128, 20), torch.randint(0, 3, (128,)))
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, DataLoader(train_set, batch_size=16, shuffle=True),
        DataLoader(eval_set, batch_size=32))
    progress_bar = tqdm(range(2 * len(train_loader)), disable=not accelerator.is_main_process)
    completed_steps = 0
    for epoch in range(2):
        for features, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress_bar.update(1)
            completed_steps += 1
            jobkit.step(completed_steps)
            if progress_bar.n and progress_bar.n % EVAL_STEPS == 0:
                jobkit.hang_begins("only the main process (with a live progress bar) evaluates")
                accuracy = evaluate(accelerator, model, eval_loader)
                accelerator.print(f"step {completed_steps}: accuracy {accuracy:.3f}")
            time.sleep(0.2)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
