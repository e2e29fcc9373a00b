"""Read the ranks' PyTorch Flight Recorder dumps and align them: which ranks wait in collective N
of a process group, which never reached it, and where ranks disagree on what N is.

The dumps are torch's own pickles (``torch._C._distributed_c10d._dump_fr_trace()``), kept as they
are so that ``torchfrtrace <run dir>/flight`` reads them. The watcher never imports torch: it reads
them with an unpickler that builds only the plain types such a dump is made of (dict, list, tuple,
str, int, float, bool, None, which need no class lookup) and refuses any global, so a dump that
names a callable (``os.system``...) is rejected instead of run.
"""
from __future__ import annotations

import ast
import io
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import Frame

MAX_DUMP_BYTES = 64 << 20   # a 2000-entry dump with frames is well under 2 MiB
DUMP_PREFIX = "rank_"       # torch's default, and what torchfrtrace infers from the names
_DUMP_NAME = re.compile(r"^rank_(\d+)$")


class UnsafeDump(ValueError):
    """The dump names a global (a class or a callable): not a Flight Recorder dump."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(f"refused global {module}.{name} in a flight recorder dump")


def loads_plain(data: bytes) -> Any:
    """Unpickle ``data`` built of plain types only; anything naming a global is UnsafeDump."""
    return _PlainUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class FlightGap:
    """Ranks ``waiting`` sit in collective ``seq`` of ``group``; live ranks ``missing`` never
    reached it (their last entry of the group is older); ``silent``: live members of the group
    with no dump to tell."""

    group: str
    group_desc: str
    seq: int
    op: str
    waiting: dict[int, FlightEntry]
    missing: tuple[int, ...]
    silent: tuple[int, ...] = ()


@dataclass(frozen=True)
class FlightMismatch:
    """Ranks disagree on collective ``seq`` of ``group``: rank -> (op, input sizes, dtypes)."""

    group: str
    seq: int
    calls: dict[int, tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]]


# ----- reading ---------------------------------------------------------------------------------
def dump_rank(name: str) -> int | None:
    """The global rank of a dump file named like torch names them (``rank_<N>``)."""
    match = _DUMP_NAME.match(name)
    return int(match.group(1)) if match else None


def read_dump(path: Path) -> FlightDump:
    """One rank's dump; ValueError (UnsafeDump among them) when it is not a readable one."""
    rank = dump_rank(path.name)
    if rank is None:
        raise ValueError(f"{path.name}: not a rank_<N> dump")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_DUMP_BYTES + 1)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"{path.name}: larger than {MAX_DUMP_BYTES} bytes")
    try:
        raw = loads_plain(data)
    except UnsafeDump:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: not a dump
        raise ValueError(f"{path.name}: unreadable ({type(exc).__name__})") from exc
    return parse_dump(rank, str(path), raw)


def read_dumps(directory: Path, ranks: Iterable[int] | None = None
               ) -> tuple[dict[int, FlightDump], dict[str, str]]:
    """The dumps in ``directory`` (of ``ranks`` only, when given), and why others were skipped."""
    dumps: dict[int, FlightDump] = {}
    skipped: dict[str, str] = {}
    wanted = None if ranks is None else set(ranks)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return dumps, skipped
    for name in names:
        rank = dump_rank(name)
        if rank is None or (wanted is not None and rank not in wanted):
            continue
        try:
            dumps[rank] = read_dump(directory / name)
        except (OSError, ValueError) as exc:
            skipped[name] = str(exc)[:200]
    return dumps, skipped


def parse_dump(rank: int, path: str, raw: Any) -> FlightDump:
    """The parts of a raw dump the diagnosis uses; entries that are not well formed are left out."""
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
        raise ValueError("not a flight recorder dump (no entries)")
    done = _completed_through(raw.get("pg_status"))
    entries = tuple(e for e in (_entry(item, done) for item in raw["entries"]) if e is not None)
    return FlightDump(rank, path, _groups(raw.get("pg_config")), entries)


def _completed_through(pg_status: Any) -> dict[str, int]:
    """pg_id -> the last collective torch saw complete (its entries retire a moment later)."""
    if not isinstance(pg_status, dict):
        return {}
    return {str(pg): status["last_completed_collective"] for pg, status in pg_status.items()
            if isinstance(status, dict)
            and isinstance(status.get("last_completed_collective"), int)}


def _groups(pg_config: Any) -> dict[str, tuple[int, ...]]:
    groups: dict[str, tuple[int, ...]] = {}
    if not isinstance(pg_config, dict):
        return groups
    for name, config in pg_config.items():
        if not isinstance(config, dict) or not name:
            continue   # torch 2.13's gloo groups are listed under '' before they are named
        ranks = config.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = ast.literal_eval(ranks)
            except (ValueError, SyntaxError):
                continue
        if isinstance(ranks, (list, tuple)) and all(isinstance(r, int) for r in ranks):
            groups[str(name)] = tuple(ranks)
    return groups


def _entry(item: Any, done: dict[str, int]) -> FlightEntry | None:
    if not isinstance(item, dict):
        return None
    group = item.get("process_group")
    name, desc = (str(group[0]), str(group[1])) if isinstance(group, (list, tuple)) \
        and len(group) == 2 else (str(item.get("pg_id", "")), "")
    p2p = bool(item.get("is_p2p"))
    seq = item.get("p2p_seq_id" if p2p else "collective_seq_id")
    if not isinstance(seq, int):
        return None
    through = done.get(str(item.get("pg_id")), -1)
    retired = bool(item.get("retired")) or (not p2p and seq <= through)
    return FlightEntry(name, desc, seq, p2p, str(item.get("profiling_name", "")),
                       str(item.get("state", "")), retired,
                       _sizes(item.get("input_sizes")), _strings(item.get("input_dtypes")),
                       _frames(item.get("frames")))


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(tuple(d for d in s if isinstance(d, int)) for s in value if isinstance(s, list))


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _frames(value: Any) -> tuple[Frame, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(Frame(str(f.get("name", "?")), str(f.get("filename", "?")),
                       f["line"] if isinstance(f.get("line"), int) else 0)
                 for f in value if isinstance(f, dict))


# ----- alignment -------------------------------------------------------------------------------
def op_name(entry: FlightEntry) -> str:
    """'all_reduce' for 'gloo:all_reduce' / 'nccl:all_reduce'."""
    return entry.op.rsplit(":", 1)[-1]


def collectives(dump: FlightDump) -> dict[str, dict[int, FlightEntry]]:
    """Group name -> seq -> the last entry of that collective (coalesced ones share a seq)."""
    out: dict[str, dict[int, FlightEntry]] = {}
    for entry in dump.entries:
        if not entry.p2p and entry.seq > 0:
            out.setdefault(entry.group, {})[entry.seq] = entry
    return out


def members(name: str, desc: str, dumps: Mapping[int, FlightDump], users: set[int]) -> set[int]:
    """The group's ranks: its pg_config in any dump, else every rank for the world, else the
    ranks that used it."""
    for dump in dumps.values():
        if name in dump.groups:
            return set(dump.groups[name])
    return set(dumps) if desc == "default_pg" else users


def _last_seq(groups: dict[str, dict[int, FlightEntry]], name: str) -> int:
    return max(groups.get(name, {}), default=0)


def flight_gaps(dumps: Mapping[int, FlightDump], live: set[int]) -> list[FlightGap]:
    """For each group with a pending collective in some live rank's dump: the live members that
    are in no pending collective of it and whose last collective of it is older (missing), and
    live members without a dump (silent)."""
    per_rank = {rank: collectives(dump) for rank, dump in dumps.items()}
    names = {(e.group, e.group_desc) for d in dumps.values() for e in d.entries if not e.p2p}
    out = []
    for name, desc in sorted(names):
        users = {r for r, groups in per_rank.items() if name in groups}
        waiting = {r: min((e for e in per_rank[r][name].values() if e.pending),
                          key=lambda e: e.seq, default=None) for r in users & live}
        pending = {r: e for r, e in waiting.items() if e is not None}
        if not pending:
            continue
        first = min(pending.values(), key=lambda e: e.seq)
        in_group = members(name, desc, dumps, users) & live
        missing = tuple(sorted(r for r in in_group - set(pending)
                               if r in dumps and _last_seq(per_rank[r], name) < first.seq))
        silent = tuple(sorted(r for r in in_group - set(dumps)))
        if missing or silent:
            out.append(FlightGap(name, desc, first.seq, op_name(first), pending, missing, silent))
    return out


def flight_mismatches(dumps: Mapping[int, FlightDump]) -> list[FlightMismatch]:
    """The first collective of each group where ranks' op, input sizes or dtypes differ."""
    by_group: dict[str, dict[int, dict[int, FlightEntry]]] = {}
    for rank, dump in dumps.items():
        for name, seqs in collectives(dump).items():
            by_group.setdefault(name, {})[rank] = seqs
    out = []
    for name, ranks in sorted(by_group.items()):
        for seq in sorted({s for seqs in ranks.values() for s in seqs}):
            calls = {r: (op_name(seqs[seq]), seqs[seq].input_sizes, seqs[seq].input_dtypes)
                     for r, seqs in sorted(ranks.items()) if seq in seqs}
            if len(calls) > 1 and len(set(calls.values())) > 1:
                out.append(FlightMismatch(name, seq, calls))
                break
    return out
