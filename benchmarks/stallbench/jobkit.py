"""What a stallbench scenario's processes call: the same few lines a real job has (init the group,
a step), plus the one thing only a benchmark has, the truth: the moment the hang begins.

No arm reads the truth file; the harness scores from it. An arm's own hooks are what that arm's
documentation asks a user to add to a job, and nothing more:

- ``STALLBENCH_PG_TIMEOUT``: seconds passed as ``init_process_group(timeout=...)`` (PyTorch's
  arm; unset, torch's default: 30 min for gloo);
- ``STALLBENCH_FR_DUMP``: a path prefix; each rank writes its Flight Recorder to PREFIX<rank> when
  a collective raises or when the launcher ends it (SIGTERM), as the Flight Recorder tutorial's
  reader must do on gloo, where nothing dumps by itself;
- ``STALLBENCH_DEBUG_DUMPS``: a folder; every rank starts PyTorch's debug server
  (``torch.distributed.debug.start_debug_server``, on ``STALLBENCH_DEBUG_PORT``) with periodic
  dumps of every rank's stacks and Flight Recorder there, at its default interval (60 s);
- ``STALLBENCH_NVRX``: each ``step()`` sends a heartbeat to nvidia-resiliency-ext's rank monitor,
  as its docs show (``RankMonitorClient.init_workload_monitoring`` then ``send_heartbeat``).

Everything else (stalldoc's agent, py-spy) needs nothing from the job.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Callable

_STATE: dict[str, Any] = {}


def hang_begins(what: str = "") -> None:
    """The truth: this process is about to stop making progress (or, in a healthy twin, is
    about to start its long quiet phase). Written once per process, before the call."""
    path = os.environ.get("STALLBENCH_TRUTH")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"t": time.time(), "pid": os.getpid(),
                                  "rank": _STATE.get("rank"), "what": what}) + "\n")


def announce(rank: int | str) -> None:
    """Tell the harness (not the arms) which process is which rank or part."""
    _STATE["rank"] = rank
    folder = os.environ.get("STALLBENCH_PIDS")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}"), "w") as out:
            out.write(str(rank))


def init(backend: str = "gloo", rank: int | None = None, world: int | None = None):
    """``torch.distributed.init_process_group`` as a job calls it (env:// from the launcher, or
    the rank and world given), with the PyTorch arm's timeout and Flight Recorder dump."""
    import torch.distributed as dist
    kwargs: dict[str, Any] = {}
    if os.environ.get("STALLBENCH_PG_TIMEOUT"):
        kwargs["timeout"] = timedelta(seconds=float(os.environ["STALLBENCH_PG_TIMEOUT"]))
    if rank is not None:
        kwargs.update(rank=rank, world_size=world)
    dist.init_process_group(backend, **kwargs)
    announce(dist.get_rank())
    if os.environ.get("STALLBENCH_FR_DUMP"):
        _dump_flight_recorder_on_the_way_out(dist.get_rank())
    if os.environ.get("STALLBENCH_DEBUG_DUMPS"):
        from torch.distributed.debug import start_debug_server
        start_debug_server(port=int(os.environ["STALLBENCH_DEBUG_PORT"]),
                           dump_dir=os.environ["STALLBENCH_DEBUG_DUMPS"],
                           enabled_dumps={"stacks", "fr_trace"})
    return dist.get_rank(), dist.get_world_size()


def _dump_flight_recorder_on_the_way_out(rank: int) -> None:
    def dump() -> None:
        if _STATE.get("dumped"):
            return
        _STATE["dumped"] = True
        import torch._C._distributed_c10d as c10d
        with open(f"{os.environ['STALLBENCH_FR_DUMP']}{rank}", "wb") as out:
            out.write(c10d._dump_fr_trace())

    def on_term(signum: int, frame: Any) -> None:
        dump()
        sys.exit(128 + signum)

    previous = sys.excepthook

    def on_raise(*info: Any) -> None:
        dump()
        previous(*info)

    signal.signal(signal.SIGTERM, on_term)
    sys.excepthook = on_raise


def step(number: int) -> None:
    """One training step done: the heartbeat that NVRx's docs ask for."""
    if os.environ.get("STALLBENCH_NVRX"):
        client = _STATE.get("nvrx")
        if client is None:
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
            client = _STATE["nvrx"] = RankMonitorClient()
            client.init_workload_monitoring()
        client.send_heartbeat()


def ray_env() -> dict[str, str]:
    """The environment a Ray actor needs for jobkit and for every arm's hooks (pass it as
    ``runtime_env={"env_vars": jobkit.ray_env()}``: Ray's workers do not inherit the driver's)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("STALLBENCH_", "TORCH_FR_")) or k == "PYTHONPATH"}


def spawn(main: Callable[[int, int], None], nprocs: int) -> None:
    """``torch.multiprocessing.spawn`` as a job calls it, on a free port."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    mp.spawn(_spawned, args=(main, nprocs), nprocs=nprocs, join=True)


def _spawned(rank: int, main: Callable[[int, int], None], nprocs: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs))
    main(rank, nprocs)
