"""Connections probe (psutil): the TCP peers of each rank outside the job itself, read when a
stall is diagnosed. A rank that waits on a reward or rollout server has an established connection
to it; connections between the job's own processes (gloo, NCCL's store, torchrun's rendezvous)
are left out by matching the job's listening ports."""
from __future__ import annotations

from typing import Iterable

import psutil

from stalldoc.model import RankProcess


def _tcp(pid: int) -> list:
    try:
        return psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return []


def external_peers(ranks: Iterable[RankProcess], job_pids: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """Rank -> ``host:port`` of its established TCP peers that are not the job's own sockets."""
    own_ports = {c.laddr.port for pid in job_pids for c in _tcp(pid)
                 if c.status == psutil.CONN_LISTEN and c.laddr}
    own_local = {(c.laddr.ip, c.laddr.port) for pid in job_pids for c in _tcp(pid) if c.laddr}
    out = {}
    for rank in ranks:
        peers = sorted({f"{c.raddr.ip}:{c.raddr.port}" for c in _tcp(rank.pid)
                        if c.status == psutil.CONN_ESTABLISHED and c.raddr
                        and c.raddr.port not in own_ports
                        and (c.raddr.ip, c.raddr.port) not in own_local})
        if peers:
            out[rank.rank] = tuple(peers)
    return out
