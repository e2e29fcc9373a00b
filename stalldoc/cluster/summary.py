"""A node's summary: what one node's watcher tells the other nodes' watchers of a multi-node job,
rewritten every tick as ``SHARED_RUN_DIR/<node>/summary.json`` (``cluster/publish.py``) and read
by the others (``peers.py``).

Small on purpose (about 300 bytes per rank): each rank's global number, phase, verdict and the
seconds since it last showed work, its frame when known, and per process group the collectives
started and completed and the one pending. Ages, never timestamps, cross hosts: the reader puts
them on its own clock, so the nodes' clocks need not agree. A summary from another host is
untrusted input: bounded in size, every field checked, anything malformed is skipped whole.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from stalldoc.model.cluster import RemoteRank
from stalldoc.model.collectives import CollectiveRecord, GroupState

FORMAT = 1
SUMMARY_FILE = "summary.json"
MAX_BYTES = 1 << 20          # 1 MiB: ~3,000 ranks on one node; anything bigger is not ours
MAX_TEXT = 300               # a frame, a phase, a name
VERDICTS = ("work", "pending", "idle")


class BadSummary(ValueError):
    """A summary that is not one (truncated, another format, a field of the wrong kind)."""


@dataclass(frozen=True)
class Published:
    """One node's summary as it was written."""

    node: str                      # the subdirectory name: node-1
    label: str                     # node 1
    host: str
    seq: int                       # rises with every summary the node writes
    state: str                     # running / ended
    world_size: int | None
    stall_id: int | None
    stall_stacks: bool
    ranks: tuple[RemoteRank, ...]


def encode(summary: Published) -> bytes:
    """The summary as compact JSON."""
    return json.dumps({
        "format": FORMAT, "node": summary.node, "label": summary.label, "host": summary.host,
        "seq": summary.seq, "state": summary.state, "world_size": summary.world_size,
        "stall": ({"id": summary.stall_id, "stacks": summary.stall_stacks}
                  if summary.stall_id is not None else None),
        "ranks": [_rank(r) for r in summary.ranks]}, separators=(",", ":")).encode()


def _rank(rank: RemoteRank) -> dict[str, Any]:
    return {"rank": rank.rank, "pid": rank.pid, "phase": rank.phase, "verdict": rank.verdict,
            "work_age": round(rank.work_age, 2), "progress_age": round(rank.progress_age, 2),
            "dead": rank.dead, "frame": rank.frame, "stack": rank.stack_kind,
            "groups": [_group(g) for g in rank.groups]}


def _group(group: GroupState) -> dict[str, Any]:
    pending = group.ring[-1] if group.ring and not group.ring[-1].completed else None
    return {"name": group.name, "started": group.started, "completed": group.completed,
            "pending": None if pending is None else {
                "seq": pending.seq, "op": pending.op, "numel": pending.numel,
                "dtype": pending.dtype}}


def decode(data: bytes) -> Published:
    """A summary read from a file; BadSummary when it is not a valid one."""
    if len(data) > MAX_BYTES:
        raise BadSummary(f"{len(data)} bytes, more than {MAX_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadSummary(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadSummary("not a stalldoc node summary of format 1")
    label = _text(doc, "label")
    stall = doc.get("stall")
    if stall is not None and not isinstance(stall, dict):
        raise BadSummary("stall is not an object")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list):
        raise BadSummary("ranks is not a list")
    return Published(
        _text(doc, "node"), label, _text(doc, "host"), _int(doc, "seq"),
        _choice(doc, "state", ("running", "ended")), _int(doc, "world_size", none=True),
        _int(stall, "id") if stall else None, bool(stall and stall.get("stacks") is True),
        tuple(_read_rank(r, label) for r in ranks))


def _read_rank(doc: object, label: str) -> RemoteRank:
    if not isinstance(doc, dict):
        raise BadSummary("a rank is not an object")
    groups = doc.get("groups")
    if not isinstance(groups, list):
        raise BadSummary("groups is not a list")
    return RemoteRank(_int(doc, "rank"), label, _int(doc, "pid"), _text(doc, "phase"),
                      _choice(doc, "verdict", VERDICTS), _age(doc, "work_age"),
                      _age(doc, "progress_age"), doc.get("dead") is True, _text(doc, "frame"),
                      _text(doc, "stack"), tuple(_read_group(g) for g in groups))


def _read_group(doc: object) -> GroupState:
    if not isinstance(doc, dict):
        raise BadSummary("a group is not an object")
    name, started = _text(doc, "name"), _int(doc, "started")
    pending = doc.get("pending")
    ring: tuple[CollectiveRecord, ...] = ()
    if isinstance(pending, dict):
        ring = (CollectiveRecord(name, _int(pending, "seq"), _text(pending, "op"),
                                 _int(pending, "numel"), _text(pending, "dtype"), 0.0, None,
                                 False),)
    return GroupState(name, started, _int(doc, "completed"), ring)


def _text(doc: dict, key: str) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str):
        raise BadSummary(f"{key} is not text")
    return value[:MAX_TEXT]


def _int(doc: dict, key: str, none: bool = False) -> Any:
    value = doc.get(key)
    if value is None and none:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
        raise BadSummary(f"{key} is not a whole number")
    return value


def _age(doc: dict, key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value) or value < 0:
        raise BadSummary(f"{key} is not a number of seconds")
    return float(value)


def _choice(doc: dict, key: str, allowed: tuple[str, ...]) -> str:
    value = doc.get(key)
    if value not in allowed:
        raise BadSummary(f"{key} is not one of {', '.join(allowed)}")
    return str(value)
