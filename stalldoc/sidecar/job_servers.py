"""The job's own servers a stalled rank waits on: a process below a rank of a distributed job
that serves HTTP (a reward model or rollout server the trainer started as its child, found by
the URL its agent wrote: ``sidecar/served.ServedRanks.parts``), matched to the ranks whose main
thread waits in an HTTP client by the connections they hold to its listening ports. Read when
a stall is diagnosed."""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import psutil

from stalldoc.analysis.stacks import handling, server_wait, waits_on_network
from stalldoc.model.ranks import RankProcess
from stalldoc.model.served import JobServer
from stalldoc.model.stacks import RankStacks
from stalldoc.probes.connections import connected_servers
from stalldoc.probes.pyspy import StackProbe
from stalldoc.redact import redact_argv
from stalldoc.sidecar.served import ServedRanks

COMMAND_CHARS = 160   # a server's command as said: its start, where a long one is cut


def waited_servers(served: ServedRanks, live: Iterable[RankProcess],
                   stacks: Mapping[int, RankStacks], probe: StackProbe
                   ) -> dict[int, tuple[JobServer, ...]]:
    """Rank -> the job's servers it waits on in an HTTP client (its main thread, or a thread
    of its own the main thread waits on), each read where it handles a request (py-spy,
    without pausing it: ``analysis.stacks.handling``)."""
    if not served.parts:
        return {}
    waiting = [r for r in live if r.rank in stacks
               and waits_on_network(server_wait(stacks[r.rank])) is not None]
    if not waiting:
        return {}
    held = connected_servers(waiting, served.parts)
    pids = {pid for found in held.values() for pid in found}
    servers = {pid: _where(server, probe) for pid, server in   # py-spy only those waited on
               served.job_servers({pid: command_of(pid) for pid in pids}).items()
               if pid in pids}
    return {rank: tuple(servers[pid] for pid in found if pid in servers)
            for rank, found in held.items()}


def _where(server: JobServer, probe: StackProbe) -> JobServer:
    stacks = probe.capture(RankProcess(-server.pid, server.pid, None, ()), True,
                           nonblocking=True, fallback=False)
    found = handling(stacks) if stacks.threads else None
    if found is None:
        return server
    thread, frame, wait = found
    return dataclasses.replace(server, thread=thread.name or str(thread.thread_id),
                               frame=str(frame), waits_on=wait)


def command_of(pid: int) -> str:
    """The process's command line as said: secrets redacted, each path by its file name, cut
    at ``COMMAND_CHARS``; '' when it cannot be read."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return ""
    words = [word.rsplit("/", 1)[-1] if word.startswith("/") else word
             for word in redact_argv(argv)]
    text = " ".join(words)
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS] + "..."
