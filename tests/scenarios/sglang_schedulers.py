"""A rollout engine's schedulers as SGLang starts them (``Engine._launch_scheduler_processes``):
the host process spawns one scheduler per TP rank; each names itself ``sglang::scheduler_TP<n>``
and creates the engine's own world with SGLang's ``init_distributed_environment`` at a port of
its own (gloo here: no GPU), then runs SGLang's request loop shape: TP 0 takes the requests
and broadcasts them to the other ranks through SGLang's group coordinator, every rank runs the
step, and the ranks meet at the coordinator's barrier. The host waits for each step's result
on a pipe, as SGLang's tokenizer manager waits for its detokenizer.

argv: the TP size, the steps, a file the schedulers' pids are written to (one a line)."""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time


def scheduler(tp_rank: int, tp_size: int, port: int, steps: int, out) -> None:
    import setproctitle
    import torch
    from sglang.srt.distributed import parallel_state

    setproctitle.setproctitle(f"sglang::scheduler_TP{tp_rank}")
    parallel_state.init_distributed_environment(
        backend="gloo", world_size=tp_size, rank=tp_rank, local_rank=tp_rank,
        distributed_init_method=f"tcp://127.0.0.1:{port}")
    group = parallel_state.get_world_group()
    weight = torch.randn(256, 256)
    for step in range(steps):
        requests = [f"req-{step}-{n}" for n in range(4)] if tp_rank == 0 else None
        requests = group.broadcast_object(requests, src=0)
        hidden = torch.randn(len(requests), 256)
        for _ in range(50):
            hidden = torch.tanh(hidden @ weight)
        group.barrier()
        if tp_rank == 0:
            out.send((step, float(hidden.sum())))
        time.sleep(0.2)


def main() -> None:
    tp_size, steps, pids_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.set_start_method("spawn", force=True)   # as SGLang's engine does
    receive, send = mp.Pipe(duplex=False)
    procs = [mp.Process(target=scheduler, args=(n, tp_size, port, steps, send), daemon=True)
             for n in range(tp_size)]
    for proc in procs:
        proc.start()
    with open(pids_file, "w") as f:
        f.write("".join(f"{p.pid}\n" for p in procs))
    for _ in range(steps):
        step, total = receive.recv()
        print(f"engine step {step}: {total:.3f}", flush=True)
    for proc in procs:
        proc.join()


if __name__ == "__main__":
    main()
