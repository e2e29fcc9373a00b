"""A CUDA job (GPU machines only): a few steps of an "offload" phase copying weights host<->device
and a "compute" phase of matmuls, then a hang where the GPU is busy with a kernel that does not end
(torch.cuda._sleep) and the host blocks in torch.cuda.synchronize. The GPU has reached every CUDA
marker (the "generate" phase's was recorded before the kernel): the host's wait says the rest."""
import os
import time

import torch

import stalldoc

HANG_CYCLES = int(os.environ.get("HANG_CYCLES", str(10**12)))


def main() -> None:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    host = torch.empty(256 * 2**20 // 4, pin_memory=True)          # 256 MiB of "weights"
    weights = torch.empty_like(host, device=device)
    a = torch.randn(4096, 4096, device=device)
    for _ in range(int(os.environ.get("STEPS", "6"))):
        with stalldoc.phase("offload"):
            for _ in range(8):
                weights.copy_(host, non_blocking=True)
                host.copy_(weights, non_blocking=True)
            torch.cuda.synchronize()
        with stalldoc.phase("compute"):
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        time.sleep(0.5)
    with stalldoc.phase("generate"):
        torch.cuda._sleep(HANG_CYCLES)       # a kernel that spins for (practically) ever
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
