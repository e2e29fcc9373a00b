"""Inside rank 1, the main thread waits for the communication thread while holding the lock it needs

source: https://github.com/horovod/horovod/issues/3352
shape: a Horovod-style trainer (2 spawned ranks) whose background communication thread drains a
  queue of tensors, runs each all-gather and then records the result under the handle-table lock;
  at step 6 rank 1's main thread calls synchronize() while holding that lock, so its comm thread
  waits in _release_tensor and rank 0's comm thread waits in the next all-gather. A Python lock
  stands in for the GIL of the thread
launch: spawn 2
truth: hang
culprit: 1
frame: synchronize
cause: python_deadlock
needs: torch
"""
import itertools
import queue
import threading
import time

import torch
import torch.distributed as dist

import jobkit


class BackgroundComm:
    """Collectives run on one background thread; callers get a handle and synchronize() on it."""

    def __init__(self) -> None:
        self.table_lock = threading.Lock()
        self.pending: queue.Queue = queue.Queue()
        self.table: dict[int, dict] = {}
        self.ids = itertools.count()
        threading.Thread(target=self._background_loop, name="comm-background", daemon=True).start()

    def allgather_async(self, tensor: torch.Tensor) -> int:
        handle = next(self.ids)
        self.table[handle] = {"tensor": tensor, "done": threading.Event(), "output": None}
        self.pending.put(handle)
        return handle

    def synchronize(self, handle: int) -> torch.Tensor:
        entry = self.table[handle]
        entry["done"].wait()
        return entry["output"]

    def _background_loop(self) -> None:
        while True:
            handle = self.pending.get()
            tensor = self.table[handle]["tensor"]
            output = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
            dist.all_gather(output, tensor)
            self._release_tensor(handle, torch.stack(output))

    def _release_tensor(self, handle: int, output: torch.Tensor) -> None:
        with self.table_lock:
            self.table[handle]["output"] = output
            self.table[handle]["done"].set()


def average_gradients(comm: BackgroundComm, model: torch.nn.Module, hold_lock: bool) -> None:
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    if hold_lock:   # keep the handle table still while the checkpoint hook snapshots it
        with comm.table_lock:
            handle = comm.allgather_async(flat)
            jobkit.hang_begins("rank 1 waits for its comm thread while holding the table lock "
                               "the comm thread needs")
            gathered = comm.synchronize(handle)
    else:
        gathered = comm.synchronize(comm.allgather_async(flat))
    averaged, start = gathered.mean(0), 0
    for p in model.parameters():
        p.grad.copy_(averaged[start:start + p.numel()].view_as(p))
        start += p.numel()


def train(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    comm = BackgroundComm()
    for step in range(40):
        loss = model(torch.randn(16, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        average_gradients(comm, model, hold_lock=(rank == 1 and step == 6))
        optimizer.step()
        jobkit.step(step)
        if rank == 0:
            print(f"step {step} loss {float(loss.detach()):.4f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    jobkit.spawn(train, 2)
