"""`if is_main_process: save ... else: wait_for_everyone()`: rank 0 trains on, rank 1 waits in a barrier

source: https://github.com/huggingface/accelerate/issues/2690
shape: an accelerate training script started from a notebook-style launcher (accelerate's
  notebook_launcher, 2 CPU processes, gloo) whose end-of-epoch save block was changed to
  `if accelerator.is_main_process: save_pretrained(...) else: accelerator.wait_for_everyone()`;
  after saving, rank 0 starts the next epoch and waits in its first collective (the prepared
  DataLoader's RNG-sync broadcast) while rank 1 waits in the barrier rank 0 never enters
launch: python
truth: hang
culprit: 0
frame: train_one_epoch
cause: collective_mismatch
needs: torch, accelerate
"""
import json
import socket
import time
from pathlib import Path

import torch
from accelerate import Accelerator, notebook_launcher
from torch.utils.data import DataLoader, TensorDataset

import jobkit


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.GELU(),
                                       torch.nn.Linear(48, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def save_pretrained(self, folder: Path, state_dict: dict) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(state_dict, folder / "pytorch_model.bin")
        (folder / "config.json").write_text(json.dumps({"in_features": 12, "hidden": 48}))


def train_one_epoch(accelerator: Accelerator, model, optimizer, loader, epoch: int) -> float:
    model.train()
    for number, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        jobkit.step(epoch * len(loader) + number)
        time.sleep(0.2)
    return loss.item()


def training_function(output_dir: str) -> None:
    jobkit.init()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(42)
    x = torch.randn(384, 12)
    data = TensorDataset(x, x.sum(-1, keepdim=False) * 0.5)
    model = Regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=32, shuffle=True))
    for epoch in range(3):
        loss = train_one_epoch(accelerator, model, optimizer, loader, epoch)
        accelerator.print(f"epoch {epoch}: loss {loss:.4f}")
        if accelerator.is_main_process:
            unwrapped_model = accelerator.unwrap_model(model)
            unwrapped_model.save_pretrained(Path(output_dir) / f"epoch_{epoch}",
                                            accelerator.get_state_dict(model))
            jobkit.hang_begins("rank 0 saved and starts the next epoch without wait_for_everyone")
        else:
            accelerator.wait_for_everyone()
    accelerator.end_training()


def main() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    notebook_launcher(training_function, args=(str(Path("outputs").resolve()),),
                      num_processes=2, use_port=str(port))


if __name__ == "__main__":
    main()
