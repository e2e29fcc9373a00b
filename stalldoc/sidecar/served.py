"""The job's serving ranks: a rank whose main thread serves HTTP (its agent wrote where:
``probes/served.served_url``) works for its clients. While its engine waits for requests it has
no work in hand, and no stall is its (a server nobody sends a request to is not hung); while
its engine holds requests, it is judged as any rank, by its engine's forward passes: once its
engine has run one, the server's own socket traffic (health checks, metric scrapes, a
Prometheus of the user's, answers to its clients) is no sign of work. A vLLM server's own
metrics are read once, when a stall of it is diagnosed: reading them every tick would be
socket traffic of ours in the server.

A server that a rank of a distributed job started below it (a reward model or a rollout server a
trainer runs as a child), or that serves below no rank (a launch script's, a Ray driver's), is
no serving of a rank: the ranks are judged by their own work, and the server is a part of the
job they may wait on (``JobServer``). Only a rank watched alone, as the job's one process,
serves through the processes below it (``vllm serve --api-server-count N``)."""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Mapping

from stalldoc.agent.statefile import SERVED_PREFIX
from stalldoc.model.ranks import RankProcess
from stalldoc.model.samples import HostSample
from stalldoc.model.served import JobServer, ServedRank, ServerMetrics
from stalldoc.probes.host import rank_of
from stalldoc.probes.served import read_metrics, read_requests, served_url

MAX_PEERS = 4   # servers asked for their metrics at one diagnosis (2 s each at most)


class ServedRanks:
    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.urls: dict[int, tuple[int, str]] = {}   # rank -> (its pid, the URL it serves)
        # a job's server's pid -> (the rank it is below, None: none; the URL it serves)
        self.parts: dict[int, tuple[int | None, str]] = {}
        self.fresh_parts: list[tuple[int, int | None, str]] = []   # new this refresh

    def refresh(self, ranks: Iterable[RankProcess], parents: Mapping[int, int]
                ) -> list[tuple[int, str]]:
        """The ranks that serve, by the URLs the job's processes wrote: a rank serves when it
        does, or when a process below it does and the rank is the job's one process, watched
        alone (``vllm serve --api-server-count N`` serves from children of its own); below a
        rank of a distributed job, or below no rank (a Ray driver's reward server), a serving
        process is a server of the job's (``parts``).
        (rank, URL) of the serving ranks new since the last call."""
        by_pid = {r.pid: r for r in ranks}
        rank_pids = {pid: r.rank for pid, r in by_pid.items()}
        known = {**dict(self.urls.values()), **{p: u for p, (_, u) in self.parts.items()}}
        found: dict[int, tuple[int, str]] = {}
        before, self.parts = self.parts, {}
        for pid in sorted(self._serving_pids()):
            if pid not in parents and pid not in rank_pids:
                continue   # not a process of the job now
            rank = rank_of(pid, rank_pids, parents)
            url = known.get(pid) or served_url(self.directory, pid)
            if url is None:
                continue
            if rank is None or (pid not in rank_pids and _distributed(by_pid, rank)):
                self.parts[pid] = (rank, url)   # below no rank: a driver's server, say
            elif rank not in found or pid in rank_pids:
                found[rank] = (pid, url)
        new = [(rank, url) for rank, (pid, url) in sorted(found.items())
               if self.urls.get(rank) != (pid, url)]
        self.urls = found
        self.fresh_parts = [(pid, rank, url) for pid, (rank, url) in sorted(self.parts.items())
                            if before.get(pid) != (rank, url)]
        return new

    def job_servers(self, commands: Mapping[int, str]) -> dict[int, JobServer]:
        """The job's servers below its ranks by pid, with the requests each holds now and its
        command (``commands``: pid -> command line, where known)."""
        out = {}
        for pid, (rank, url) in sorted(self.parts.items()):
            counts = read_requests(self.directory, pid)
            out[pid] = JobServer(pid, rank, url, commands.get(pid, ""),
                                 counts[0] if counts is not None else None)
        return out

    def _serving_pids(self) -> set[int]:
        if not self.directory:
            return set()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return set()
        return {int(name[len(SERVED_PREFIX):-4]) for name in names
                if name.startswith(SERVED_PREFIX) and name.endswith(".txt")
                and name[len(SERVED_PREFIX):-4].isdigit()}

    def awaiting(self, idle: Iterable[int], with_engines: Iterable[int] = ()) -> set[int]:
        """The serving ranks with no work in hand: those among ``idle`` (their vLLM engine
        waits for requests), and those without an engine (``with_engines``: the ranks that have
        one) whose server holds no request now (a reward model's server, say, nobody asks)."""
        engines = set(with_engines)
        quiet = {rank for rank, (pid, _) in self.urls.items() if rank not in engines
                 and (read_requests(self.directory, pid) or (None,))[0] == 0}
        return (set(idle) & set(self.urls)) | quiet

    def without_traffic(self, host: Mapping[int, HostSample], engines_ran: Iterable[int]
                        ) -> dict[int, HostSample]:
        """``host`` with the I/O of the serving ranks whose engine has run a forward pass
        (``engines_ran``) left out of their work."""
        quiet = set(engines_ran) & set(self.urls)
        return {rank: dataclasses.replace(sample, io_bps=None) if rank in quiet else sample
                for rank, sample in host.items()}

    def view(self, idle: Iterable[int], ranks: Iterable[int] = ()) -> dict[int, ServedRank]:
        """Each serving rank and whether its engine waits for requests; the vLLM metrics of
        those in ``ranks`` (the first ``MAX_PEERS``), read now (a server that does not answer
        in 2 s says so)."""
        idle, read = set(idle), sorted(set(ranks) & set(self.urls))[:MAX_PEERS]
        out = {}
        for rank, (pid, url) in sorted(self.urls.items()):
            metrics, error = read_metrics(url) if rank in read else (None, "")
            counts = read_requests(self.directory, pid)
            out[rank] = ServedRank(rank, pid, url, rank in idle, metrics, error,
                                   counts[0] if counts is not None else None)
        return out


def _distributed(ranks: Mapping[int, RankProcess], rank: int) -> bool:
    """Whether ``rank`` is a rank of a distributed job (its process said which rank it is), not
    the job's one process, guessed rank 0."""
    return any(r.rank == rank and r.from_env for r in ranks.values())


def peer_servers(peers: Iterable[str]) -> dict[str, ServerMetrics]:
    """The vLLM metrics of the servers at ``peers`` (``host:port`` a rank waits on in an HTTP
    client) that serve them; the others are left out. Read at a diagnosis only."""
    out = {}
    for peer in sorted(set(peers))[:MAX_PEERS]:
        host, _, port = peer.rpartition(":")
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        metrics, _ = read_metrics(url)
        if metrics is not None:
            out[peer] = metrics
    return out
