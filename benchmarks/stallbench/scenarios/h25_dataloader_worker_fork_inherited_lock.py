"""A validation DataLoader worker forked while a thread held the decoder lock blocks on its first decode

source: https://github.com/ultralytics/ultralytics/pull/26085, https://github.com/pytorch/pytorch/issues/1355
shape: a DDP image-regression job (2 ranks); at the first validation the last rank's image-logging
  thread holds the (non fork-safe) decoder lock while the val DataLoader forks its worker, so the
  worker inherits a held lock with no owner and waits in decode_image forever; rank 1 waits on the
  loader's queue (timeout=0), rank 0 in the next gradient all-reduce. A Python lock stands in for
  glibc's __exit_funcs_lock that cv2.imdecode needs
launch: torchrun 2
truth: hang
culprit: val_worker1
frame: decode_image
cause: python_deadlock
needs: torch
"""
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import jobkit

_DECODER_LOCK = threading.Lock()   # the decoder library's global init lock: not fork-safe


def decode_image(raw: bytes) -> torch.Tensor:
    if _DECODER_LOCK.locked():
        jobkit.hang_begins("the forked worker inherited the decoder lock held by a parent thread")
    with _DECODER_LOCK:
        pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float() / 255
    return pixels.view(3, 8, 8)


class ImageFolder(Dataset):
    def __init__(self, split: str, size: int) -> None:
        generator = torch.Generator().manual_seed(0 if split == "train" else 1)
        self.raw = [bytes(torch.randint(0, 256, (192,), generator=generator, dtype=torch.uint8).tolist())
                    for _ in range(size)]
        self.targets = torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int):
        return decode_image(self.raw[index]), self.targets[index]


def log_image_previews(raws: list[bytes]) -> None:
    """Decodes a grid of sample images for the experiment tracker (in a background thread)."""
    with _DECODER_LOCK:
        for raw in raws:
            torch.frombuffer(bytearray(raw), dtype=torch.uint8).float().sum()
            time.sleep(0.2)


def validate(model, loader: DataLoader) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for images, targets in loader:
            total += float(torch.nn.functional.mse_loss(model.module(images.flatten(1)), targets))
            count += 1
    return total / max(count, 1)


def worker_init(worker_id: int) -> None:
    jobkit.announce(f"val_worker{dist.get_rank()}")


def main() -> None:
    rank, world = jobkit.init()
    train_set, val_set = ImageFolder("train", 64), ImageFolder("val", 32)
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True, num_workers=0)
    val_loader = DataLoader(val_set, batch_size=8, num_workers=1, persistent_workers=True,
                            multiprocessing_context="fork", worker_init_fn=worker_init)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(192, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    for epoch in range(10):
        for images, targets in train_loader:
            loss = torch.nn.functional.mse_loss(model(images.flatten(1)), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            jobkit.step(step)
            step += 1
            time.sleep(0.2)
        if epoch % 2 == 1:
            if rank == world - 1:   # the last rank logs image previews
                threading.Thread(target=log_image_previews, args=(val_set.raw[:30],),
                                 name="image-previews", daemon=True).start()
                time.sleep(0.3)
            print(f"rank {rank} epoch {epoch} val_mse {validate(model, val_loader):.4f}", flush=True)


if __name__ == "__main__":
    main()
