"""Lightning: on_validation_epoch_end logs with sync_dist=True only under is_global_zero

source: https://github.com/Lightning-AI/pytorch-lightning/issues/19783
shape: a LightningModule trained with Trainer(accelerator="cpu", devices=2, strategy="ddp");
  validation_step updates a torchmetrics Accuracy; on_validation_epoch_end computes it and calls
  self.log("val_acc", acc, sync_dist=True) inside `if self.trainer.is_global_zero:`; rank 0 waits
  in compute()'s all-gather while rank 1 is in the checkpoint callback's all-reduce
launch: python
truth: hang
culprit: 0
frame: on_validation_epoch_end
cause: collective_mismatch
needs: torch, lightning, torchmetrics
budget: 120
"""
import os
import time

import lightning as L
import torch
import torchmetrics
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import jobkit


class ProcessGroupFromJob(DDPStrategy):
    """Lightning's DDP strategy, with the process group made by the job's own init call."""

    def setup_distributed(self) -> None:
        self.set_world_ranks()
        os.environ["MASTER_ADDR"] = self.cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(self.cluster_environment.main_port)
        jobkit.init("gloo", rank=self.global_rank, world=self.world_size)
        super().setup_distributed()


class DigitClassifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.val_accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        jobkit.step(self.global_step)
        time.sleep(0.2)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_accuracy.update(self(x).argmax(-1), y)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.is_global_zero:
            jobkit.hang_begins("rank 0 alone computes the synced accuracy and logs it with "
                               "sync_dist=True: collectives rank 1 never joins")
            acc = self.val_accuracy.compute()
            self.log("val_acc", acc, sync_dist=True)
        self.val_accuracy.reset()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 32, generator=generator), torch.randint(0, 10, (512,), generator=generator)
    train = DataLoader(TensorDataset(x[:384], y[:384]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[384:], y[384:]), batch_size=16)
    return train, val


def main() -> None:
    train, val = loaders()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=ProcessGroupFromJob(process_group_backend="gloo"),
                        max_epochs=3, limit_train_batches=6, limit_val_batches=2,
                        num_sanity_val_steps=0, enable_progress_bar=False, logger=False,
                        enable_checkpointing=True)
    trainer.fit(DigitClassifier(), train, val)


if __name__ == "__main__":
    main()
