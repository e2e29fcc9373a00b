"""Connections probe: the TCP peers of each rank outside the job itself, read when a stall is
diagnosed. A rank that waits on a reward or rollout server has an established connection to it;
connections between the job's own processes (gloo, NCCL's store, torchrun's rendezvous) are left
out by matching the job's listening ports.

The socket table is read once per diagnosis for all ranks (on Linux: /proc/net/tcp and tcp6,
then each process's socket inodes from /proc/PID/fd): reading it once per process costs
seconds at 64 ranks connected full-mesh. Elsewhere psutil reads each process's connections.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Iterable

import psutil

from stalldoc.model.ranks import RankProcess

ESTABLISHED, LISTEN = "01", "0A"   # /proc/net/tcp's state codes
_PSUTIL_STATES = {psutil.CONN_ESTABLISHED: ESTABLISHED, psutil.CONN_LISTEN: LISTEN}
_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))


@dataclass(frozen=True)
class TcpSocket:
    local: tuple[str, int]
    remote: tuple[str, int] | None   # None when not connected
    state: str                       # /proc/net/tcp's code: ESTABLISHED, LISTEN, ...


def _address(text: str, family: int) -> tuple[str, int]:
    """``0100007F:1F90`` (the kernel's byte order, 32-bit words) → ("127.0.0.1", 8080)."""
    host, _, port = text.partition(":")
    raw = bytes.fromhex(host)
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, ordered), int(port, 16)


def parse_table(text: str, family: int, wanted: set[int] | None = None) -> dict[int, TcpSocket]:
    """One /proc/net/tcp{,6} file → socket inode → socket (only the ``wanted`` inodes, if given:
    the others' addresses are not decoded)."""
    out = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or not fields[9].isdigit():
            continue
        inode = int(fields[9])
        if wanted is not None and inode not in wanted:
            continue
        remote = _address(fields[2], family)
        out[inode] = TcpSocket(_address(fields[1], family), remote if remote[1] else None,
                               fields[3])
    return out


def socket_table(wanted: set[int] | None = None) -> dict[int, TcpSocket] | None:
    """The TCP sockets of this network namespace by inode (only the ``wanted`` ones, if given);
    None where /proc has no table."""
    table: dict[int, TcpSocket] = {}
    found = False
    for path, family in _TABLES:
        try:
            with open(path) as handle:
                table.update(parse_table(handle.read(), family, wanted))
            found = True
        except (OSError, ValueError):
            continue
    return table if found else None


def listening_sockets() -> dict[int, int] | None:
    """Socket inode → port of every listening TCP socket of this network namespace, from the
    tables alone (no process's descriptors read); None where /proc has no table."""
    found: dict[int, int] = {}
    read = False
    for path, _family in _TABLES:
        try:
            with open(path) as handle:
                text = handle.read()
        except OSError:
            continue
        read = True
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 10 and fields[3] == LISTEN and fields[9].isdigit():
                found[int(fields[9])] = int(fields[1].rpartition(":")[2], 16)
    return found if read else None


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (empty when it cannot be read)."""
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _from_psutil(pid: int) -> list[TcpSocket]:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return []
    return [TcpSocket((c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port) if c.raddr else None,
                      _PSUTIL_STATES.get(c.status, c.status)) for c in conns if c.laddr]


def sockets_by_pid(pids: Iterable[int]) -> dict[int, list[TcpSocket]]:
    """Each process's TCP sockets, the table read once for all of them."""
    if not os.path.exists(_TABLES[0][0]):   # no /proc (not Linux)
        return {pid: _from_psutil(pid) for pid in set(pids)}
    inodes = {pid: socket_inodes(pid) for pid in set(pids)}
    wanted = set().union(*inodes.values())
    table = (socket_table(wanted) if wanted else {}) or {}
    return {pid: [table[i] for i in found if i in table] for pid, found in inodes.items()}


def external_peers(ranks: Iterable[RankProcess], job_pids: Iterable[int]
                   ) -> dict[int, tuple[str, ...]]:
    """Rank -> ``host:port`` of its established TCP peers that are not the job's own sockets."""
    ranks = list(ranks)
    job = set(job_pids)
    sockets = sockets_by_pid(job | {r.pid for r in ranks})
    own = [s for pid in job for s in sockets[pid]]
    own_ports = {s.local[1] for s in own if s.state == LISTEN}
    own_local = {s.local for s in own}
    out = {}
    for rank in ranks:
        peers = sorted({f"{s.remote[0]}:{s.remote[1]}" for s in sockets[rank.pid]
                        if s.state == ESTABLISHED and s.remote is not None
                        and s.remote[1] not in own_ports and s.remote not in own_local})
        if peers:
            out[rank.rank] = tuple(peers)
    return out


def connected_servers(ranks: Iterable[RankProcess], servers: Iterable[int]
                      ) -> dict[int, tuple[int, ...]]:
    """Rank -> the pids among ``servers`` (the job's own processes that serve) it holds an
    established TCP connection to, on one of their listening ports of this host."""
    ranks, servers = list(ranks), set(servers)
    sockets = sockets_by_pid(servers | {r.pid for r in ranks})
    listening = {s.local[1]: pid for pid in servers for s in sockets[pid] if s.state == LISTEN}
    out = {}
    for rank in ranks:
        found = sorted({listening[s.remote[1]] for s in sockets[rank.pid]
                        if s.state == ESTABLISHED and s.remote is not None
                        and s.remote[1] in listening and _here(s.remote[0], s.local[0])})
        if found:
            out[rank.rank] = tuple(found)
    return out


def _here(remote: str, local: str) -> bool:
    """Whether a connection's far end is this host: a loopback address, or the address the
    connection itself leaves from (a server reached by the host's own name)."""
    return remote == local or remote.startswith("127.") or remote in ("::1", "::ffff:127.0.0.1")
