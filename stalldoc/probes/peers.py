"""The other nodes' summaries in a multi-node job's shared run directory (``cluster/summary.py``).

Each read lists the shared directory once and reads every other node's ``summary.json`` (at most
1 MiB each, links never followed). A node's freshness is judged on this watcher's own clock: the
time its summary's sequence number was last seen to change, so hosts' clocks need not agree. A
node silent for longer than ``lost_after`` is lost (down, cut off from the shared filesystem, or
its watcher gone); one that wrote its last summary as ended is finished, not lost.

Reads are spaced out with the node count (``every``): with 1,000 nodes each watcher reads the
others every 10 s, not every second (docs/multi-node.md).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from stalldoc.cluster.summary import MAX_BYTES, SUMMARY_FILE, BadSummary, Published, decode
from stalldoc.model import PeerNode

READ_PER_NODE = 0.01      # seconds of spacing per node: every = max(interval, nodes x this)
MIN_LOST_AFTER = 15.0     # a watcher taking its ranks' stacks does not publish for seconds
NEVER_SEEN_GRACE = 120.0  # nodes of one job may start minutes apart
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass
class _Seen:
    summary: Published
    changed_at: float       # our clock: when its seq last changed


def read_spacing(interval: float, nodes: int | None) -> float:
    """Seconds between two reads of all the other nodes."""
    return max(interval, (nodes or 1) * READ_PER_NODE)


def lost_after(interval: float, nodes: int | None) -> float:
    return max(MIN_LOST_AFTER, 5 * read_spacing(interval, nodes))


class PeerReader:
    def __init__(self, shared: Path, own: str, expected: tuple[str, ...], interval: float,
                 nodes: int | None, started_at: float) -> None:
        self.shared, self.own, self.expected = shared, own, expected
        self.every = read_spacing(interval, nodes)
        self.lost_after = lost_after(interval, nodes)
        self.started_at = started_at
        self.read_at = float("-inf")
        self.seen: dict[str, _Seen] = {}
        self.unreadable: dict[str, str] = {}    # node -> why its summary was skipped
        self.reads = 0

    def due(self, now: float, soon: float | None = None) -> bool:
        """Whether a read is due (``soon``: a shorter spacing, while this node looks stalled)."""
        every = self.every if soon is None else min(self.every, soon)
        return now - self.read_at >= every

    def read(self, now: float) -> None:
        """Read every other node's summary now."""
        self.read_at = now
        self.reads += 1
        try:
            entries = [e for e in os.scandir(self.shared)
                       if e.name != self.own and e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            self.unreadable[""] = f"{self.shared}: {exc.strerror or exc}"
            return
        for entry in entries:
            self._read_one(entry.name, Path(entry.path) / SUMMARY_FILE, now)

    def _read_one(self, name: str, path: Path, now: float) -> None:
        try:
            summary = decode(_read_capped(path))
        except FileNotFoundError:
            return       # a node directory whose watcher has not published yet
        except (OSError, BadSummary) as exc:
            self.unreadable[name] = str(exc)
            return
        self.unreadable.pop(name, None)
        known = self.seen.get(name)
        if known is None or known.summary.seq != summary.seq:
            self.seen[name] = _Seen(summary, now)

    def peers(self, now: float) -> tuple[PeerNode, ...]:
        """The other nodes as last read, judged at ``now``."""
        out = []
        for name, seen in sorted(self.seen.items()):
            s = seen.summary
            silent = max(0.0, now - seen.changed_at)
            out.append(PeerNode(name, s.label or name, s.host, s.state, round(silent, 1),
                                silent > self.lost_after and s.state != "ended", s.stall_id,
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


def _read_capped(path: Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of a regular file (never a link, a FIFO or a device)."""
    fd = os.open(path, _OPEN)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
