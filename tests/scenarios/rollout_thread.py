"""Ranks whose rollouts run on a generation thread of their own, marked there as the phase
``rollout`` (``stalldoc.phase``), while the main thread waits for the samples on a socket, as a
trainer waits on its rollout client's reply. Each rank then all-reduces its mean reward.

ROLLOUT_SECONDS: how long a rollout computes (CPU-bound sampling in Python). PHASED=0: the thread
does not mark the phase (a busy background thread while the main thread waits on a socket)."""
import os
import random
import socket
import threading
import time

import torch
import torch.distributed as dist

import stalldoc

ROLLOUT_SECONDS = float(os.environ.get("ROLLOUT_SECONDS", "8"))
PHASED = os.environ.get("PHASED", "1") == "1"


def sample_completions(seconds: float) -> list[float]:
    """Stand-in for a decode loop: token by token, in Python, until the time is up."""
    deadline, rewards, logits = time.monotonic() + seconds, [], [random.random() for _ in range(64)]
    while time.monotonic() < deadline:
        token = max(range(64), key=lambda i: logits[i] * random.random())
        logits[token] *= 0.99
        rewards.append(logits[token])
    return rewards


def generation_thread(reply: socket.socket) -> None:
    if PHASED:
        with stalldoc.phase("rollout"):
            rewards = sample_completions(ROLLOUT_SECONDS)
    else:
        rewards = sample_completions(ROLLOUT_SECONDS)
    reply.sendall(f"{sum(rewards) / len(rewards):.6f}\n".encode())


def wait_for_rollout(client: socket.socket) -> float:
    return float(client.makefile().readline())


def main() -> None:
    dist.init_process_group("gloo")
    client, server = socket.socketpair()
    threading.Thread(target=generation_thread, args=(server,), name="rollout", daemon=True).start()
    reward = torch.tensor([wait_for_rollout(client)])
    dist.all_reduce(reward)
    print(f"rank {dist.get_rank()}: mean reward {reward.item() / dist.get_world_size():.3f}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
