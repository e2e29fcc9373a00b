"""Collectives the Python wrapper cannot see: the process groups' own sequence numbers.

DDP's reducer (gradient all-reduces, the start-up broadcast) and other c10d internals issue their
collectives from C++, past ``agent/collectives.py``'s wrappers, so a pure DDP loop never moves
the agent's rings. Every gloo and NCCL process group counts the collectives issued on it
(``ProcessGroup._get_sequence_number_for_group()``: gloo's ``seq_``, NCCL's
``seqCollective_``), whoever issued them. The heartbeat thread reads that number of every group
in ``torch.distributed.distributed_c10d._world.pg_map`` once a beat (a few pybind calls, no
lock, no I/O) and publishes their total over every group it has seen, and when it last rose,
in the state file's c10d slot (``statefile.StateWriter.c10d``).

Why this and not the alternatives (torch 2.13, gloo here):
- Flight Recorder: works on gloo, but its only reader is a full dump (``_dump_fr_trace``, the
  whole ring pickled: O(buffer) per read) and it records only when TORCH_FR_BUFFER_SIZE was set
  before the group was made. Kept for the diagnosis (``agent/flight.py``), not as a counter.
- A DDP communication hook (``register_comm_hook``): changes the user's model (a second
  ``register_comm_hook`` raises, so a job with its own hook would break) and runs Python per
  bucket on the autograd thread, in the job's hot path. The agent must not change behaviour.
- Work objects (``_world``): torch keeps no list of in-flight works to count.

The number counts collectives issued, not completed: a rank waiting inside a collective that
never returns issues nothing more, so a hang still shows no progress. Standard library only:
torch is reached through ``sys.modules`` and only once the process itself imported it.
``STALLDOC_C10D_COUNTERS=0`` turns the reading off.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

C10D_MODULE = "torch.distributed.distributed_c10d"
ENV_C10D_COUNTERS = "STALLDOC_C10D_COUNTERS"   # 0: not read (the benchmark's baseline)


def wanted(environ: Any) -> bool:
    """Whether the counters are read (all but ``STALLDOC_C10D_COUNTERS=0``)."""
    return environ.get(ENV_C10D_COUNTERS, "1") != "0"


class C10dCounters:
    """The collectives issued on this process's groups, summed over the groups."""

    def __init__(self) -> None:
        self.total = 0                       # issued since each group was first seen
        self.groups = 0                      # groups read at the last beat
        self._last: dict[str, int] = {}      # group name -> its sequence number last beat
        self._unsupported: set[str] = set()  # groups whose backend keeps no sequence number

    def read(self) -> bool:
        """Read every group's sequence number; whether the total rose."""
        before = self.total
        groups = 0
        for group in _process_groups():
            name = _group_name(group)
            if name in self._unsupported:
                continue
            try:
                seq = _sequence(group)
            except Exception:  # noqa: BLE001 - a backend without sequence numbers (mpi, custom)
                self._unsupported.add(name)
                continue
            groups += 1
            last = self._last.get(name, 0)
            self.total += seq - last if seq >= last else seq   # lower: a group made anew
            self._last[name] = seq
        self.groups = groups
        return self.total > before


def _process_groups() -> list[Any]:
    """The live process groups (none before ``init_process_group`` or after its destroy)."""
    c10d = sys.modules.get(C10D_MODULE)
    world = getattr(c10d, "_world", None)
    pg_map = getattr(world, "pg_map", None)
    try:
        return list(pg_map) if pg_map else []
    except RuntimeError:   # the job made or destroyed a group meanwhile: read it next beat
        return []


def _sequence(group: Any) -> int:
    """The collectives issued on ``group``. A group of several device backends (the default
    ``init_process_group()`` on a GPU node: ``cpu:gloo,cuda:nccl``) has no number of its own
    (torch raises): the sum of its backends' numbers, each backend counted once."""
    try:
        return int(group._get_sequence_number_for_group())
    except RuntimeError:
        backends = {id(b): b for b in (group._get_backend(d) for d in group._device_types)}
        return sum(int(b._get_sequence_number_for_group()) for b in backends.values())


def _group_name(group: Any) -> str:
    try:
        return str(group.group_name)
    except Exception:  # noqa: BLE001 - an old or foreign group object: its identity will do
        return f"id{id(group)}"
