"""A Lightning 2.x DDP job on the CPU, written the way the Lightning docs write one and started
the way users start one: ``python lightning_ddp.py``, no launcher. Lightning's ``ddp`` strategy
then re-runs this very command line once per extra rank (``subprocess.Popen([sys.executable,
*sys.argv])`` with ``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set), so rank 0 is the process the user started and ranks 1.. are its children.

DEVICES ranks (default 2) train a Linear model on a random TensorDataset for STEPS steps (default
6). Each rank prints ``rank R step S`` as it enters a step. With STUCK_RANK set to a global rank
(unset or -1: a healthy run), that rank blocks for good at step STUCK_STEP (default 2) inside
``training_step``, in a function named STUCK_FUNC (default ``load_shard``); the other ranks go on
to ``backward()`` and wait in DDP's gradient all-reduce.

NUM_NODES (default 1) > 1 makes it one node of a multi-node job (``Trainer(num_nodes=...)``):
start it once per node with NODE_RANK, MASTER_ADDR and MASTER_PORT set, as Lightning's docs
say for a cluster without a scheduler; node k's ranks are k * DEVICES + 0..DEVICES-1."""
import os
import threading
import types

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

DEVICES = int(os.environ.get("DEVICES", "2"))
STEPS = int(os.environ.get("STEPS", "6"))
NUM_NODES = int(os.environ.get("NUM_NODES", "1"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
STUCK_FUNC = os.environ.get("STUCK_FUNC", "load_shard")


def load_shard() -> None:
    """Where the stuck rank stops: waits on an event nobody sets."""
    threading.Event().wait()


def _named(name: str):
    """``load_shard`` under the name ``name`` (its code object renamed, as py-spy and
    ``sys._current_frames`` show it; file and line numbers stay this file's)."""
    code = load_shard.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, globals(), name)


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        print(f"rank {self.global_rank} step {self.global_step}", flush=True)
        if self.global_rank == STUCK_RANK and self.global_step == STUCK_STEP:
            _named(STUCK_FUNC)()
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)


def main() -> None:
    L.seed_everything(0)
    dataset = TensorDataset(torch.randn(256, 32), torch.randint(0, 2, (256,)))
    loader = DataLoader(dataset, batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=DEVICES, strategy="ddp", num_nodes=NUM_NODES,
                        max_steps=STEPS,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(TinyModel(), loader)
    print(f"rank {trainer.global_rank} done", flush=True)


if __name__ == "__main__":
    main()
