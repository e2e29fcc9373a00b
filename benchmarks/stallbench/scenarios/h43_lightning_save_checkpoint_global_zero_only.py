"""`trainer.save_checkpoint()` under `if trainer.is_global_zero:` after fit(): rank 0 ends one barrier ahead

source: https://github.com/alan-turing-institute/autocast/pull/386
shape: a Lightning DDP run (torchrun 2, CPU, gloo) that, after trainer.fit(), saves the final
  checkpoint only on global zero; save_checkpoint ends in strategy.barrier(), which pairs with
  the other rank's "checkpoint-alias-finalize" barrier, so rank 0 then waits alone in its own
  finalize barrier; rank 1 has left and sits at interpreter exit, joining its log-sync thread,
  which waits for every rank's "finished" marker (rank 0's never comes)
launch: torchrun 2
truth: hang
culprit: 0
frame: finalize_checkpoint_alias
cause: rank_outside_collective
needs: torch, lightning
"""
import threading
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import jobkit

RUN_DIR = Path("run").resolve()


class Forecaster(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        jobkit.step(self.global_step)
        time.sleep(0.1)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def loaders():
    x = torch.randn(256, 16)
    y = x[:, :4].cumsum(-1)
    return (DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16),
            DataLoader(TensorDataset(x[192:], y[192:]), batch_size=16))


def sync_run_logs(rank: int, world: int) -> None:
    """Ship the run's logs once every rank has marked the run finished."""
    while not all((RUN_DIR / f"finished.{r}").exists() for r in range(world)):
        time.sleep(2)
    (RUN_DIR / f"uploaded.{rank}").write_text("ok")


def finalize_checkpoint_alias(trainer: L.Trainer, path: Path) -> None:
    trainer.strategy.barrier("checkpoint-alias-finalize")
    if trainer.is_global_zero:
        alias = path.with_name("final.ckpt")
        alias.unlink(missing_ok=True)
        alias.symlink_to(path.name)


def main() -> None:
    rank, world = jobkit.init()
    RUN_DIR.mkdir(exist_ok=True)
    threading.Thread(target=sync_run_logs, args=(rank, world), name="log-sync").start()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=RUN_DIR)
    train, val = loaders()
    trainer.fit(Forecaster(), train, val)
    path = RUN_DIR / "checkpoints" / "epoch-end.ckpt"
    if trainer.is_global_zero:
        jobkit.hang_begins("global zero alone calls save_checkpoint, a collective that ends in a barrier")
        trainer.save_checkpoint(path)
    finalize_checkpoint_alias(trainer, path)
    (RUN_DIR / f"finished.{rank}").write_text(str(time.time()))


if __name__ == "__main__":
    main()
