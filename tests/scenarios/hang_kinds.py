"""A data-parallel training job where one rank gets stuck the way real jobs do.

Every rank trains a few steps (a small linear model, gradients all-reduced over gloo). At step
HANG_STEP, rank HANG_RANK goes into a user function (named HANG_FUNC) that never returns, while
the other ranks go on into the step's ``dist.all_reduce`` and wait there. Kinds (HANG):

  queue_get     the data-loading thread died (its shard is missing) before putting a batch;
                the rank blocks forever in ``queue.Queue().get()``.
  lock          a cache-refresh thread took a ``threading.Lock`` and finished without releasing
                it (an early return); the rank blocks forever in ``lock.acquire()``.
  sleep_poll    the rank waits for a "ready" flag file that nobody will create:
                ``while not os.path.exists(flag): time.sleep(0.2)`` (CPU idle, stack moving).
  socket_read   the rank asks a reward/inference server on 127.0.0.1:SERVER_PORT for a score;
                the server accepted the connection and never answers: blocks in ``sock.recv``.
  checkpoint_open
                the rank saves its checkpoint with ``torch.save`` to CHECKPOINT_PATH on a file
                system that no longer answers (here a FIFO nobody reads: the open never
                returns, as on a hung NFS mount); the others wait in the next all_reduce.
  rank_exits    the rank ran out of data ("uneven inputs") and returns from main (exit 0) while
                the others call all_reduce.
  rank_exits_with_child
                the same, but first the rank forks a child (like a data-loader worker that
                outlives it) that keeps the inherited sockets open.

Environment: HANG (default queue_get), HANG_RANK (default 1), HANG_STEP (default 2),
HANG_FUNC (name of the stuck function; default depends on HANG), SERVER_PORT (socket_read),
CHECKPOINT_PATH (checkpoint_open),
BUSY_THREAD=1 (from the hang step on, every rank runs a metrics thread always on the CPU),
LINGER_SECONDS (rank_exits_with_child: how long the orphaned child lives; default 120).

What gloo does (torch 2.13, CPU): with ``rank_exits`` the peers' all_reduce fails at once with
"RuntimeError: ... Connection closed by peer" (the exiting process closes its sockets) and
torchrun exits 1, naming rank 0 as the root cause. With ``rank_exits_with_child`` the child keeps
the sockets open, so the peers block in all_reduce (idle CPU) until the process-group timeout.
The orphaned child is reparented to init in the dead rank's session; torchrun does not signal it
even on SIGTERM (the rank it started is gone), hence LINGER_SECONDS.
"""
import os
import queue
import socket
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from data_parallel import train_step

HANG = os.environ.get("HANG", "queue_get")
HANG_RANK = int(os.environ.get("HANG_RANK", "1"))
HANG_STEP = int(os.environ.get("HANG_STEP", "2"))
LINGER_SECONDS = float(os.environ.get("LINGER_SECONDS", "120"))
DEFAULT_FUNC = {"queue_get": "next_batch", "lock": "refresh_tokenizer_cache",
                "sleep_poll": "wait_for_dataset_ready", "socket_read": "score_with_reward_model",
                "checkpoint_open": "save_checkpoint"}


def renamed(func, name: str):
    """``func`` with its code object renamed, so stacks show ``name`` as the stuck function."""
    return type(func)(func.__code__.replace(co_name=name, co_qualname=name), globals())


# ---------------------------------------------------------------- queue_get
def _produce_batches(batches: "queue.Queue") -> None:
    with open("/nonexistent/data/shard-00017.jsonl") as fh:  # raises: the thread dies
        for line in fh:
            batches.put(line)


def _get_batch(batches: "queue.Queue"):
    return batches.get()


def hang_in_queue_get(name: str) -> None:
    batches: "queue.Queue" = queue.Queue(maxsize=8)
    threading.Thread(target=_produce_batches, args=(batches,), name="producer", daemon=True).start()
    renamed(_get_batch, name)(batches)


# ---------------------------------------------------------------- lock
def _refresh_cache(lock: threading.Lock, cache: dict) -> None:
    lock.acquire()
    if not cache:  # early return that forgets the release
        return
    lock.release()


def _use_cache(lock: threading.Lock) -> None:
    lock.acquire()


def hang_in_lock(name: str) -> None:
    lock = threading.Lock()
    refresher = threading.Thread(target=_refresh_cache, args=(lock, {}), name="cache-refresh")
    refresher.start()
    refresher.join()
    renamed(_use_cache, name)(lock)


# ---------------------------------------------------------------- sleep_poll
def _poll_for_flag(flag_path: str) -> None:
    while not os.path.exists(flag_path):
        time.sleep(0.2)


def hang_in_sleep_poll(name: str) -> None:
    flag = os.path.join(tempfile.gettempdir(), f"dataset-ready-{os.getpid()}.flag")
    renamed(_poll_for_flag, name)(flag)


# ---------------------------------------------------------------- socket_read
def _request_score(port: int) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b'POST /score HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}')
    return sock.recv(4096)


def hang_in_socket_read(name: str) -> None:
    renamed(_request_score, name)(int(os.environ["SERVER_PORT"]))


# ---------------------------------------------------------------- checkpoint_open
def _save(model_state: dict) -> None:
    torch.save(model_state, os.environ["CHECKPOINT_PATH"])


def hang_in_checkpoint_open(name: str) -> None:
    renamed(_save, name)({"weight": torch.zeros(64, 1)})


# ---------------------------------------------------------------- rank_exits_with_child
def fork_lingering_worker() -> None:
    """A forked child (like a data-loader worker) that outlives the rank, holding its sockets."""
    if os.fork() == 0:
        time.sleep(LINGER_SECONDS)
        os._exit(0)


# ---------------------------------------------------------------- BUSY_THREAD
def log_metrics() -> None:
    """A background thread always on the CPU, its stack changing: not the rank's work."""
    while True:
        _summarise(list(range(2000)))
        _format_line(time.time())


def _summarise(values: list) -> float:
    return sum(v * v for v in values) / len(values)


def _format_line(t: float) -> str:
    return " ".join(f"{t * n:.3f}" for n in range(200))


HANGS = {"queue_get": hang_in_queue_get, "lock": hang_in_lock,
         "sleep_poll": hang_in_sleep_poll, "socket_read": hang_in_socket_read,
         "checkpoint_open": hang_in_checkpoint_open}


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Linear(64, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(HANG_STEP + 3):
        if step == HANG_STEP and os.environ.get("BUSY_THREAD") == "1":
            threading.Thread(target=log_metrics, name="metrics", daemon=True).start()
        if rank == HANG_RANK and step == HANG_STEP:
            if HANG.startswith("rank_exits"):
                print(f"[rank {rank}] no more data after {step} steps, exiting", flush=True)
                if HANG == "rank_exits_with_child":
                    fork_lingering_worker()
                return
            print(f"[rank {rank}] hang starts at {time.time():.3f}", flush=True)
            HANGS[HANG](os.environ.get("HANG_FUNC", DEFAULT_FUNC[HANG]))
        train_step(model, optimizer, step)
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
