"""The other nodes' summaries in a multi-node job's shared run directory (``cluster/summary.py``).

A full read lists the shared directory once and reads every other node's ``summary.json`` (at
most 1 MiB each, links never followed); a neighbour read reads only the next two nodes by index
(each node watches its neighbours for silence, so every node is watched by two others at a cost
that does not grow with the node count). A node's silence is judged on this watcher's own clock:
how long its summary's sequence number was seen unchanged, so hosts' clocks need not agree. A
node silent for longer than ``lost_after`` is lost (down, cut off from the shared filesystem, or
its watcher gone); one that wrote its last summary as ended is finished, not lost.

Reads are spaced out with the node count (docs/multi-node.md): neighbours every
``max(interval, nodes x 10 ms)``, everyone (only while this node's ranks show no work) every
``max(interval, nodes x 30 ms)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stalldoc.cluster.summary import MAX_BYTES, SUMMARY_FILE, BadSummary, Published, decode
from stalldoc.launch.files import open_regular
from stalldoc.model.cluster import PeerNode

READ_PER_NODE = 0.01      # seconds of spacing per node: every = max(interval, nodes x this)
FULL_READ_PER_NODE = 0.03   # the same for reads of every node (quiet_every)
NEIGHBOURS = 2
MIN_LOST_AFTER = 15.0     # a watcher taking its ranks' stacks does not publish for seconds
NEVER_SEEN_GRACE = 120.0  # nodes of one job may start minutes apart


@dataclass
class _Seen:
    summary: Published
    changed_at: float       # our clock: when its seq last changed
    read_at: float          # our clock: when we last read it


def read_spacing(interval: float, nodes: int | None) -> float:
    """Seconds between two reads of all the other nodes."""
    return max(interval, (nodes or 1) * READ_PER_NODE)


def full_read_spacing(interval: float, nodes: int | None) -> float:
    """Seconds between two reads of every other node while this node's ranks show no work."""
    return max(interval, (nodes or 1) * FULL_READ_PER_NODE)


def lost_after(interval: float, nodes: int | None) -> float:
    return max(MIN_LOST_AFTER, 5 * read_spacing(interval, nodes))


class PeerReader:
    def __init__(self, shared: Path, own: str, expected: tuple[str, ...], interval: float,
                 nodes: int | None, started_at: float) -> None:
        self.shared, self.own, self.expected = shared, own, expected
        self.every = read_spacing(interval, nodes)
        self.quiet_every = full_read_spacing(interval, nodes)
        self.lost_after = lost_after(interval, nodes)
        self.started_at = started_at
        self.read_at = float("-inf")          # the last read of any kind
        self.full_read_at = float("-inf")     # the last read of every node
        self.seen: dict[str, _Seen] = {}
        self.unreadable: dict[str, str] = {}    # node -> why its summary was skipped
        self.files_read = 0

    def due(self, now: float, full: bool) -> bool:
        """Whether a read of every node (``full``) or of the neighbours is due."""
        if full:
            return now - self.full_read_at >= self.quiet_every
        return now - self.read_at >= self.every

    def read(self, now: float) -> None:
        """Read every other node's summary now."""
        self.read_at = self.full_read_at = now
        try:
            names = [e.name for e in os.scandir(self.shared)
                     if e.name != self.own and e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            self.unreadable[""] = f"{self.shared}: {exc.strerror or exc}"
            return
        for name in names:
            self._read_one(name, now)

    def read_neighbours(self, now: float) -> None:
        """Read the next nodes after this one by index (all known nodes when unindexed)."""
        self.read_at = now
        for name in self.neighbours():
            self._read_one(name, now)

    def neighbours(self) -> list[str]:
        """The next NEIGHBOURS nodes after this one in index order, wrapping around."""
        ring = sorted(set(self.expected) | set(self.seen) | {self.own}, key=_by_index)
        here = ring.index(self.own)
        after = [ring[(here + i) % len(ring)] for i in range(1, NEIGHBOURS + 1)]
        return [n for n in dict.fromkeys(after) if n != self.own]

    def _read_one(self, name: str, now: float) -> None:
        self.files_read += 1
        try:
            summary = decode(_read_capped(self.shared / name / SUMMARY_FILE))
        except FileNotFoundError:
            return       # a node directory whose watcher has not published yet
        except (OSError, BadSummary) as exc:
            self.unreadable[name] = str(exc)
            return
        self.unreadable.pop(name, None)
        known = self.seen.get(name)
        if known is None or known.summary.seq != summary.seq:
            self.seen[name] = _Seen(summary, now, now)
        else:
            known.read_at = now

    def peers(self, now: float) -> tuple[PeerNode, ...]:
        """The other nodes as last read, judged at ``now``."""
        out = []
        for name, seen in sorted(self.seen.items(), key=lambda item: _by_index(item[0])):
            s = seen.summary
            silent = max(0.0, seen.read_at - seen.changed_at)
            out.append(PeerNode(name, s.label or name, s.host, s.state, round(silent, 1),
                                silent > self.lost_after and s.state != "ended",
                                round(max(0.0, now - seen.changed_at), 1), s.stall_id,
                                s.stall_stacks, s.ranks))
        return tuple(out)

    def never_seen(self, now: float) -> tuple[str, ...]:
        """Expected nodes that published nothing, once the start-up grace has passed."""
        if now - self.started_at < max(NEVER_SEEN_GRACE, self.lost_after):
            return ()
        return tuple(n for n in self.expected if n != self.own and n not in self.seen)

    def world_size(self) -> int | None:
        sizes = [s.summary.world_size for s in self.seen.values() if s.summary.world_size]
        return max(sizes) if sizes else None


def _by_index(name: str) -> tuple[int, str]:
    """node-2 before node-10; names without an index after, by name."""
    tail = name.rpartition("-")[2]
    return (int(tail), "") if tail.isdigit() else (1 << 62, name)


def _read_capped(path: Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of a regular file (never a link, a FIFO or a device)."""
    with open_regular(str(path), follow=False) as fh:
        return fh.read(MAX_BYTES + 1)
