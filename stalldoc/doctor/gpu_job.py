"""The jobs ``stalldoc doctor --gpu`` watches on the real device, one per case (``sys.argv[1]``),
each run as ``stalldoc watch -- PYTHON gpu_job.py CASE`` in the job's own interpreter (it imports
torch; stalldoc never does):

- ``markers``: phases of matmuls for a few seconds (CUDA sync markers issued and completed), then
  2 GiB held in the caching allocator for a few seconds (NVML's per-process memory against
  ``torch.cuda.memory_reserved()``); exits 0.
- ``kernel_hang``: a few phases, then a kernel that does not end (``torch.cuda._sleep``) and the
  host blocked in ``synchronize``: SD203.
- ``offload``: pinned host-to-device copies of 256 MiB with no compute, for OFFLOAD_SECONDS:
  PCIe busy, GPU idle (SD201, from NVML alone: the phase is named ``step``).
- ``retries``: this process limited to half the GPU, 80 % of that cached in 64 MiB segments,
  then a block that fits no cached one and no room under the limit for a new one: the allocator
  frees its cache and retries, again and again (SD202), with no out-of-memory error.
- ``nccl_flight``: a one-rank NCCL group, a few all_reduces, then a wait that never ends: the
  stall's Flight Recorder dump is read back.
- ``graph_capture``: CUDA graphs captured in PyTorch's default (global) capture mode for
  CAPTURE_SECONDS, phases before, around and inside each capture, while the agent thread polls
  its markers: every capture succeeds and every replay computes the right values; exits 0.

Each prints ``case ready`` once its measured part began, on standard output.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

import torch

import stalldoc

OFFLOAD_SECONDS = float(os.environ.get("OFFLOAD_SECONDS", "20"))
RETRY_SECONDS = float(os.environ.get("RETRY_SECONDS", "15"))
HOLD_SECONDS = float(os.environ.get("HOLD_SECONDS", "5"))
CAPTURE_SECONDS = float(os.environ.get("CAPTURE_SECONDS", "8"))


def _device() -> torch.device:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def _steps(device: torch.device, count: int) -> None:
    a = torch.randn(2048, 2048, device=device)
    for _ in range(count):
        with stalldoc.phase("compute"):
            for _ in range(10):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        time.sleep(0.3)


def markers() -> None:
    device = _device()
    _steps(device, 10)
    held = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
    print("markers ready", torch.cuda.memory_reserved(device), flush=True)
    with stalldoc.phase("hold"):
        time.sleep(HOLD_SECONDS)
    del held


def kernel_hang() -> None:
    device = _device()
    _steps(device, 4)
    print("kernel_hang ready", flush=True)
    with stalldoc.phase("generate"):
        torch.cuda._sleep(10**13)     # spins for (practically) ever
        torch.cuda.synchronize()


def offload() -> None:
    device = _device()
    host = torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=True)
    weights = torch.empty_like(host, device=device)
    print("offload ready", flush=True)
    end = time.monotonic() + OFFLOAD_SECONDS
    while time.monotonic() < end:
        with stalldoc.phase("step"):
            for _ in range(8):
                weights.copy_(host, non_blocking=True)
            torch.cuda.synchronize()


def retries() -> None:
    device = _device()
    torch.cuda.set_per_process_memory_fraction(0.5, device)
    limit = torch.cuda.get_device_properties(device).total_memory // 2
    block = 64 * 2**20
    print("retries ready", flush=True)
    end = time.monotonic() + RETRY_SECONDS
    while time.monotonic() < end:
        with stalldoc.phase("rollout"):
            torch.cuda.empty_cache()
            cache = [torch.empty(block, dtype=torch.uint8, device=device)
                     for _ in range(int(limit * 0.8) // block)]
            del cache     # 80 % of the limit cached in 64 MiB segments, none of it free
            # a block no cached segment holds, and no room under the limit for a new one: the
            # allocator frees its cache and tries again (num_alloc_retries), then succeeds
            big = torch.empty(limit // 2, dtype=torch.uint8, device=device)
            del big
        time.sleep(0.2)


def nccl_flight() -> None:
    import torch.distributed as dist
    device = _device()
    with socket.socket() as sock:      # a free port for the group's store
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    t = torch.ones(1024, device=device)
    for _ in range(6):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print("nccl_flight ready", flush=True)
    with stalldoc.phase("wait_for_rollout"):
        threading.Event().wait()


def graph_capture() -> None:
    device = _device()
    x = torch.randn(1024, 1024, device=device)
    end, count = time.monotonic() + CAPTURE_SECONDS, 0
    print("graph_capture ready", flush=True)
    while time.monotonic() < end:
        with stalldoc.phase("step"):           # markers queued behind real work
            y = x
            for _ in range(20):
                y = (y @ x).clamp_(-1, 1)
        graph = torch.cuda.CUDAGraph()
        with stalldoc.phase("capture"), torch.cuda.graph(graph):
            with stalldoc.phase("inside"):     # a phase entered on the capturing stream
                z = torch.ones_like(x)
                for _ in range(1000):
                    z = z * 0.5 + 1.0          # converges to 2
        graph.replay()
        torch.cuda.synchronize()
        if not torch.allclose(z, torch.full_like(z, 2.0)):
            sys.exit(f"graph_capture: replay {count} computed {z.flatten()[:3].tolist()}")
        count += 1
    print(f"graph_capture ok: {count} graphs captured and replayed", flush=True)


CASES = {f.__name__: f for f in (markers, kernel_hang, offload, retries, nccl_flight,
                                 graph_capture)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
