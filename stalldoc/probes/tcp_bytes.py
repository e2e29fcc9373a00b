"""TCP bytes probe: the bytes each process's TCP connections have received and sent (acked), so
that a download or an upload over a socket is I/O work, as a file's bytes are.

The kernel's per-process I/O counters (``/proc/PID/io`` rchar, wchar) count ``read``/``write``
on any descriptor, but not ``recv``/``send`` on a socket: an HTTP client (urllib, requests,
httpx, a hub download), gloo's and Ray's transports and every ``socket.recv_into`` leave them
still. Each tick one ``sock_diag`` dump (netlink, what ``ss -ti`` reads, no privilege needed)
gives every TCP socket's ``tcpi_bytes_received`` and ``tcpi_bytes_acked`` (Linux 4.1+) by its
inode; a process's sockets are the ``socket:[INODE]`` links among its descriptors, listed when
a socket that moved bytes is not known to be anyone's (``TcpBytes``). A process's
count only grows: a socket counts from when it is first seen (a new one in full), and one that
closes keeps what it had moved. Where netlink is refused (a sandbox without it) the counts stay
at zero and the I/O is rchar + wchar alone, as before.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
INET_DIAG_INFO = 2
_HEADER = struct.Struct("=IHHII")                  # nlmsghdr
_REQUEST = struct.Struct("=BBBBI48x")              # inet_diag_req_v2, its sockid zeroed
_MESSAGE = struct.Struct("=BBBB48xIIIII")          # inet_diag_msg: ..., uid, inode
_ATTR = struct.Struct("=HH")                       # rtattr
_BYTES = struct.Struct("=QQ")                      # tcp_info: bytes_acked, bytes_received
_BYTES_AT = 120                                    # their offset in struct tcp_info
_ALL_BUT_LISTEN = 0xFFFFFFFF & ~(1 << 10)          # TCP_LISTEN moves no bytes


def tcp_traffic() -> dict[int, int] | None:
    """Socket inode -> bytes received + bytes acked, for every TCP socket of this network
    namespace (IPv4 and IPv6) that is not listening ({}: none); None where the kernel refuses
    the dump."""
    found: dict[int, int] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            for family in (socket.AF_INET, socket.AF_INET6):
                found.update(_dump(nl, family))
    except (OSError, struct.error, ValueError):
        return None
    return found


def _dump(nl: socket.socket, family: int) -> dict[int, int]:
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0,
                            _ALL_BUT_LISTEN)
    nl.send(_HEADER.pack(_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY,
                         NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request)
    found: dict[int, int] = {}
    while True:
        data = nl.recv(1 << 16)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind = _HEADER.unpack_from(data, at)[:2]
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR or length < _HEADER.size:
                raise ValueError("sock_diag refused the dump")
            found.update(_message(data[at + _HEADER.size: at + length]))
            at += (length + 3) & ~3


def _message(body: bytes) -> dict[int, int]:
    """One socket's inode and bytes moved, from its inet_diag_msg and its attributes."""
    inode = _MESSAGE.unpack_from(body)[-1]
    at = _MESSAGE.size
    while at + _ATTR.size <= len(body):
        length, kind = _ATTR.unpack_from(body, at)
        if length < _ATTR.size:
            break
        info = body[at + _ATTR.size: at + length]
        if kind == INET_DIAG_INFO and len(info) >= _BYTES_AT + _BYTES.size:
            acked, received = _BYTES.unpack_from(info, _BYTES_AT)
            return {inode: acked + received} if inode else {}
        at += (length + 3) & ~3
    return {}


def socket_inodes(pid: int, proc: str = "/proc") -> list[int]:
    """The inodes of the sockets among a process's descriptors ([] where it ended, or where
    the kernel refuses: another user's process)."""
    return [inode for inode in _descriptors(pid, {}, proc).values() if inode]


def _descriptors(pid: int, known: dict[str, int], proc: str = "/proc",
                 again: frozenset[int] = frozenset()) -> dict[str, int]:
    """A process's descriptors, each by its number: its socket's inode, 0 for anything else.
    A number in ``known`` is taken as it was unless its inode is in ``again`` (a socket that
    closed: the number may hold something new); the others' links are read."""
    folder = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        inode = known.get(name)
        if inode is None or inode in again:
            try:
                link = os.readlink(f"{folder}/{name}")
            except OSError:
                continue
            inode = int(link[8:-1]) if link.startswith("socket:[") else 0
        found[name] = inode
    return found


@dataclass
class _Counted:
    sockets: dict[int, int] = field(default_factory=dict)   # inode -> bytes at last reading
    total: int = 0                                          # bytes moved since first seen
    fds: dict[str, int] = field(default_factory=dict)       # descriptor -> socket inode or 0
    inodes: tuple[int, ...] = ()                            # its sockets, from ``fds``


class TcpBytes:
    """Each process's TCP bytes moved, a count that only grows; ``refresh`` once a tick, then
    ``of(pid)`` for each process read that tick, then ``forget`` with the processes read.

    Listing a process's descriptors costs about a microsecond each, and a rank and its workers
    hold hundreds: they are listed only at a process's first reading and on a tick whose dump
    shows a *stray*, a socket that moved bytes and that no process read holds nor is known to
    be no process's of the job (its new numbers' links read then); a stray still unclaimed
    after that is looked for once more with every link read again (a number that held a file
    may hold it now), then taken for another program's. The sockets a process is known to
    hold are counted every tick from the dump alone. A socket found late counts in full (its
    bytes since it opened): its bytes come late, never lost."""

    def __init__(self, watcher: int | None = None) -> None:
        self._watcher = watcher   # a process whose sockets are never the job's: the watcher's
        self._traffic: dict[int, int] | None = None
        self._counted: dict[tuple[int, int], _Counted] = {}   # (pid, start) -> its count
        self._strays: frozenset[int] = frozenset()   # moved, held by no process read
        self._suspects: frozenset[int] = frozenset()  # strays a listing did not find
        self._foreign: set[int] = set()               # strays no link of the job's holds

    def refresh(self) -> None:
        before, self._traffic = self._traffic, tcp_traffic()
        if self._traffic is None:
            return
        self._foreign &= set(self._traffic)
        held = {i for c in self._counted.values() for i in c.inodes}
        strays = {i for i, moved in self._traffic.items()
                  if moved and (before is None or before.get(i) != moved)
                  and i not in held and i not in self._foreign}
        if strays and self._watcher is not None:   # its own (Ray's state API, a scrape)
            self._foreign.update(socket_inodes(self._watcher))
        self._strays = frozenset((strays | (self._suspects & set(self._traffic)))
                                 - self._foreign)

    def of(self, pid: int, start: int = 0) -> int:
        """Bytes the process (``start``: its start, so that a reused pid starts anew) has moved
        over TCP since it was first read: 0 at its first reading."""
        key = (pid, start)
        counted = self._counted.get(key)
        traffic = self._traffic
        if traffic is None:   # refused this tick: what was counted stands
            return counted.total if counted else 0
        first = counted is None
        if counted is None:
            counted = self._counted[key] = _Counted()
        gone = frozenset(i for i in counted.sockets if i not in traffic)   # TCP ones closed
        if first or gone or self._strays:
            known = {} if self._strays & self._suspects else counted.fds
            counted.fds = _descriptors(pid, known, again=gone)
            counted.inodes = tuple(i for i in counted.fds.values() if i)
        now = {i: traffic[i] for i in counted.inodes if i in traffic}
        if not first:
            counted.total += sum(max(0, moved - counted.sockets.get(inode, 0))
                                 for inode, moved in now.items())
        counted.sockets = now
        return counted.total

    def forget(self, keep: set[int]) -> None:
        """The tick's end: drop the counts of processes not in ``keep`` (pids); the strays no
        listing found are looked for once more, with every link read, then are foreign."""
        for key in [k for k in self._counted if k[0] not in keep]:
            del self._counted[key]
        held = {i for c in self._counted.values() for i in c.inodes}
        unclaimed = self._strays - held
        self._foreign |= unclaimed & self._suspects
        self._suspects = unclaimed - self._suspects
        self._strays = frozenset()
