"""The run database: SQLite inside the run directory (WAL on local disks, a rollback journal on
network filesystems: ``journal.py``), with a schema version (``schema.py``) and a retention policy
that keeps it bounded over days (``retention.py``).

The watcher is the only writer (one connection, one thread); readers (``reader.py``) open it
read-only and refuse a database whose schema they do not know.
"""
from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from stalldoc.findings.ledger import Entry
from stalldoc.findings.record import entry_record
from stalldoc.model.agent import PhaseKinds
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.samples import GpuSample, HostSample, ProbeRun
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import StallEpisode
from stalldoc.redact import redact_argv as redact
from stalldoc.redact import redact_text
from stalldoc.model.samples import Tick
from stalldoc.store.journal import JournalChoice, choose_journal
from stalldoc.store.phase_hist import duration_bin
from stalldoc.store.reader import open_reader
from stalldoc.store.retention import (TABLES, LogBudget, RetentionPolicy, collective_windows,
                                      downsample, gaps, protected, prune_stacks)
from stalldoc.store.schema import (COLLECTIVE_COLUMNS, DB_NAME, DDL, GPU_COLUMNS, NODE_COLUMNS,
                                   READABLE_VERSIONS, SAMPLE_COLUMNS, SCHEMA_VERSION)

__all__ = ["DB_NAME", "READABLE_VERSIONS", "SCHEMA_VERSION", "RunStore", "open_reader", "redact"]

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(default: Any = None) -> Callable[[F], F]:
    """A write that fails (disk full, I/O error, a damaged file) is counted and dropped, never
    raised: the watching and the live diagnosis go on without the store."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def guarded(self: RunStore, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except (sqlite3.Error, OSError) as exc:
                self.failed(exc)
                return default() if callable(default) else default
        return guarded  # type: ignore[return-value]
    return wrap


class RunStore:
    """The watcher's writer."""

    def __init__(self, run_dir: Path, policy: RetentionPolicy = RetentionPolicy(),
                 journal: JournalChoice | None = None) -> None:
        self.path = run_dir / DB_NAME
        self.journal = journal or choose_journal(run_dir)
        self.policy = policy
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        for pragma in self.journal.pragmas:
            self.conn.execute(pragma)
        self.conn.executescript(DDL)
        self.conn.executemany("INSERT INTO meta VALUES (?, ?)", [
            ("schema_version", str(SCHEMA_VERSION)), ("journal_mode", self.journal.mode),
            ("filesystem", self.journal.filesystem)])
        self.logs = LogBudget(policy.log_head_bytes, policy.log_tail_bytes)
        self.compacted_until = 0.0
        self.pruned_stacks = 0
        self._phase_keys: dict[int, set[tuple[str, float]]] = {}
        self._kinds: dict[int, PhaseKinds] = {}   # rank -> its read last stored
        self._collective_keys: dict[int, dict[tuple[str, int, float], bool]] = {}  # -> completed
        self.dropped_collectives = 0    # past the cap per tick, or never read (wrapped rings)
        self._wrapped: dict[tuple[int, str], int] = {}   # (rank, group) -> GroupState.wrapped
        self.collectives_until = 0.0
        self._gpu_seen: dict[int, float] = {}      # GPU -> time of its last sample
        self.write_errors = 0
        self.first_error = ""
        self.conn.commit()

    def failed(self, exc: BaseException) -> None:
        self.write_errors += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
        try:
            self.conn.rollback()
        except sqlite3.Error:
            pass

    @_guarded()
    def start_run(self, run_id: str, argv: list[str], node: str, started_at: float,
                  stall_timeout: float, agent: bool) -> None:
        self.conn.execute("INSERT INTO run VALUES (?, ?, ?, ?, NULL, NULL, ?, ?)",
                          (run_id, json.dumps(redact(argv)), node, started_at, stall_timeout,
                           int(agent)))
        self.conn.commit()

    @_guarded()
    def probe_unavailable(self, probe: str, why: str) -> None:
        self.set_meta(f"unavailable:{probe}", why)

    @_guarded()
    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        self.conn.commit()

    @_guarded()
    def end_run(self, ended_at: float, exit_code: int | None) -> None:
        for key, value in (("pruned_log_lines", self.logs.pruned_lines),
                           ("pruned_stall_stacks", self.pruned_stacks),
                           ("dropped_collectives", self.dropped_collectives)):
            if value:
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))
        self.conn.execute("UPDATE run SET ended_at = ?, exit_code = ?", (ended_at, exit_code))
        self.conn.commit()

    @_guarded()
    def add_rank(self, rank: RankProcess, t: float) -> None:
        self.conn.execute("INSERT OR IGNORE INTO ranks (rank, pid, local_rank, cmdline, first_seen,"
                          " source, world, world_rank) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (rank.rank, rank.pid, rank.local_rank,
                           json.dumps(redact(list(rank.cmdline))), t, rank.source,
                           redact_text(rank.world), rank.world_rank))

    @_guarded()
    def update_rank(self, rank: RankProcess) -> None:
        """What a rank's process said of itself since it was stored (its claim, its world)."""
        self.conn.execute("UPDATE ranks SET local_rank = ?, source = ?, world = ?, world_rank = ?"
                          " WHERE rank = ? AND pid = ?",
                          (rank.local_rank, rank.source, redact_text(rank.world),
                           rank.world_rank, rank.rank, rank.pid))

    @_guarded()
    def drop_rank(self, rank: RankProcess) -> None:
        """Forget a process taken for the single rank 0 before the real ranks appeared (mp.spawn's
        parent, a driver): it was never a rank, so nothing of it is reported as one."""
        self.conn.execute("DELETE FROM ranks WHERE rank = ? AND pid = ?", (rank.rank, rank.pid))
        self.conn.execute("DELETE FROM stacks WHERE rank = ? AND pid = ?", (rank.rank, rank.pid))
        for table in ("samples", "watermarks", "phases", "collectives", "phase_kinds"):
            self.conn.execute(f"DELETE FROM {table} WHERE rank = ?", (rank.rank,))
        self._phase_keys.pop(rank.rank, None)
        self._kinds.pop(rank.rank, None)
        self._collective_keys.pop(rank.rank, None)

    @_guarded()
    def rank_exit(self, exit: RankExit) -> None:
        self.conn.execute("UPDATE ranks SET ended_at = ?, exit_code = ?, signal = ?, exit_source = ?"
                          " WHERE rank = ? AND pid = ?", (exit.t, exit.exit_code, exit.signal,
                                                          exit.source, exit.rank, exit.pid))

    @_guarded()
    def add_tick(self, tick: Tick) -> None:
        """Everything one tick of the probes saw, committed together."""
        rows = [_sample_row(tick, s) for s in tick.host.values()]
        self.conn.executemany(_insert("samples", SAMPLE_COLUMNS), rows)
        if tick.node is not None:
            n = tick.node
            self.conn.execute(_insert("node_samples", NODE_COLUMNS),
                              (n.t, n.available_bytes, n.total_bytes, n.swap_in_bps,
                               n.swap_out_bps, n.load1, n.cores))
        self.conn.executemany(_insert("gpu_samples", GPU_COLUMNS),
                              [_gpu_row(tick, g) for g in tick.gpus])
        self.conn.executemany(_PROBE_UPSERT, [_probe_row(p) for p in tick.probes])
        self.conn.executemany(_WATERMARK_UPSERT, [_watermark_row(row) for row in rows])
        self.conn.executemany(_GPU_PHASE_UPSERT, self._gpu_phase_rows(tick))
        for rank, agent in tick.agents.items():
            self.add_phases(rank, agent.phases)
            self.add_collectives(rank, agent.groups)
            if agent.kinds is not None:
                self.add_kinds(rank, agent.kinds)
        self.conn.commit()

    def add_kinds(self, rank: int, kinds: PhaseKinds) -> None:
        """A rank's time by kind of phase, when the read starts one of its cycles."""
        if not kinds.starts_cycle(self._kinds.get(rank)):
            return
        self._kinds[rank] = kinds
        seconds = dict(kinds.seconds)
        self.conn.executemany("INSERT OR IGNORE INTO phase_kinds VALUES (?, ?, ?, ?, ?)",
                              [(rank, kinds.counted_at, kind, entries, seconds.get(kind, 0.0))
                               for kind, entries in kinds.entries])

    def _gpu_phase_rows(self, tick: Tick) -> list[tuple[Any, ...]]:
        """Each GPU's time since its last sample, charged with its rates to its rank's phase."""
        rows = []
        for g in tick.gpus:
            last, self._gpu_seen[g.index] = self._gpu_seen.get(g.index), g.t
            if last is None or g.t <= last:
                continue
            dt = g.t - last
            rows.append((_phase_of(tick, g) or "", dt,
                         None if g.pcie_tx_bps is None else g.pcie_tx_bps * dt,
                         None if g.pcie_rx_bps is None else g.pcie_rx_bps * dt,
                         g.util_gpu, int(g.util_gpu is not None),
                         g.util_compute, int(g.util_compute is not None)))
        return rows

    def add_phases(self, rank: int, phases: Iterable[Any]) -> None:
        """The phases a rank's agent reports as ended (the same ones come back tick after tick
        while they stay in its ring): each new one stored, and summed into its phase's stats."""
        current = {(p.name, p.started_at): p.ended_at for p in phases}
        seen = self._phase_keys.get(rank, set())
        new = [(name, start, end) for (name, start), end in current.items()
               if (name, start) not in seen]
        self._phase_keys[rank] = set(current)
        self.conn.executemany("INSERT OR IGNORE INTO phases VALUES (?, ?, ?, ?)",
                              [(rank, *row) for row in new])
        self.conn.executemany(_PHASE_STATS, [(name, end - start) for name, start, end in new])
        self.conn.executemany(_PHASE_HIST, [(name, duration_bin(end - start), end - start)
                                            for name, start, end in new])

    def add_collectives(self, rank: int, groups: Iterable[Any]) -> None:
        """The collectives in a rank's rings (``GroupState.ring``: the same ones come back tick
        after tick): each new one stored (a pending one too), a stored pending one updated when
        it completes; at most the policy's newest new ones per tick, the others counted, and so
        are those a rank's ring overwrote before the watcher read them."""
        groups = list(groups)
        for g in groups:
            before = self._wrapped.get((rank, g.name), 0)
            self.dropped_collectives += max(0, g.wrapped - before)
            self._wrapped[(rank, g.name)] = max(before, g.wrapped)
        current = {(c.group, c.seq, c.entered_at): c for g in groups for c in g.ring}
        seen = self._collective_keys.get(rank, {})
        new = sorted((c for key, c in current.items() if key not in seen),
                     key=lambda c: c.entered_at)
        kept = _newest(new, self.policy.collectives_per_rank_tick)
        self.dropped_collectives += len(new) - len(kept)
        done = [c for key, c in current.items()
                if c.completed_at is not None and seen.get(key) is False]
        self._collective_keys[rank] = {key: c.completed_at is not None
                                       for key, c in current.items()}
        self.conn.executemany(_COLLECTIVE_INSERT, [_collective_row(rank, c) for c in kept])
        self.conn.executemany("UPDATE collectives SET completed_at = ? WHERE rank = ? AND grp = ?"
                              " AND seq = ? AND entered_at = ?",
                              [(c.completed_at, rank, c.group, c.seq, c.entered_at) for c in done])

    @_guarded()
    def add_logs(self, lines: list[Any]) -> None:
        """Log lines, within the log budget (the first ones kept, then the latest)."""
        if not lines:
            return
        self.conn.executemany("INSERT INTO logs VALUES (?, ?, ?)",
                              [(x.t, x.stream, x.text) for x in lines])
        self.logs.added(self.conn, sum(len(x.text) + 24 for x in lines))

    @_guarded()
    def save_stall(self, episode: StallEpisode) -> None:
        work = {str(r): {**asdict(w), "seen": w.describe()} for r, w in episode.work.items()}
        self.conn.execute("INSERT OR REPLACE INTO stalls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (episode.id, episode.started_at, episode.detected_at, episode.ended_at,
                           episode.threshold, json.dumps(list(episode.ranks)),
                           json.dumps({str(r): p for r, p in episode.phases.items()}),
                           json.dumps(work)))
        self.conn.commit()

    @_guarded()
    def add_stacks(self, stall_id: int | None, stacks: Iterable[RankStacks]) -> None:
        """The stacks of a stall; those of stalls between the first and the latest few go."""
        self.conn.executemany("INSERT INTO stacks VALUES (?, ?, ?, ?, ?, ?, ?)", [
            (stall_id, s.rank, s.pid, s.t, s.method, s.error,
             json.dumps([asdict(t) for t in s.threads])) for s in stacks])
        self.pruned_stacks += prune_stacks(self.conn, self.policy.stacks_first_stalls,
                                           self.policy.stacks_last_stalls)

    @_guarded()
    def put_findings(self, entries: Iterable[Entry]) -> None:
        """Ledger entries as they are now, each its row (the entry's id is the row's): new ones
        inserted, changed ones (updated, resolved) overwritten."""
        rows = [_finding_row(entry_record(e)) for e in entries]
        if rows:
            self.conn.executemany(_FINDING_UPSERT, rows)
            self.conn.commit()

    @_guarded()
    def compact(self, now: float, keep_seconds: float) -> None:
        """Downsample what is older than ``keep_seconds`` (at least the policy's full-resolution
        span) and outside every stall's and finding's surroundings; at most once a bucket."""
        horizon = now - max(keep_seconds, self.policy.full_resolution_seconds)
        if horizon - self.compacted_until < self.policy.bucket_seconds:
            return
        for lo, hi in gaps(self.compacted_until, horizon, protected(self.conn, self.policy)):
            for table in TABLES:
                downsample(self.conn, table, lo, hi, self.policy.bucket_seconds)
            self.conn.execute("DELETE FROM phases WHERE ended_at >= ? AND ended_at < ?", (lo, hi))
        self.compacted_until = horizon
        self.compact_collectives(now - max(keep_seconds, self.policy.collectives_seconds))
        self.conn.commit()

    def compact_collectives(self, horizon: float) -> None:
        """Drop the completed collective calls before ``horizon`` outside the stalls' and
        findings' surroundings."""
        for lo, hi in gaps(self.collectives_until, horizon,
                           collective_windows(self.conn, self.policy)):
            self.conn.execute("DELETE FROM collectives WHERE completed_at >= ? AND "
                              "completed_at < ?", (lo, hi))
        self.collectives_until = max(self.collectives_until, horizon)

    @_guarded()
    def commit(self) -> None:
        self.conn.commit()

    @_guarded()
    def close(self) -> None:
        self.conn.commit()
        self.conn.close()


_PROBE_UPSERT = (
    "INSERT INTO probe_stats VALUES (?, 1, ?, ?, ?, ?, ?) ON CONFLICT (probe) DO UPDATE SET "
    "runs = runs + 1, failures = failures + excluded.failures, "
    "skipped = skipped + excluded.skipped, total_seconds = total_seconds + excluded.total_seconds,"
    " max_seconds = MAX(max_seconds, excluded.max_seconds), last_error = CASE WHEN "
    "excluded.last_error != '' THEN excluded.last_error ELSE last_error END")
FINDING_COLUMNS = ("id", "t", "stall_id", "code", "name", "severity", "ranks", "summary",
                   "evidence", "fix", "trigger", "updated_at", "resolved_at", "occurrences")
_FINDING_JSON = ("ranks", "evidence")
_FINDING_UPSERT = (f"INSERT INTO findings ({', '.join(FINDING_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(FINDING_COLUMNS))}) ON CONFLICT (id) DO UPDATE SET "
                   + ", ".join(f"{c} = excluded.{c}" for c in FINDING_COLUMNS[1:]))
_COLLECTIVE_INSERT = (f"INSERT OR IGNORE INTO collectives ({', '.join(COLLECTIVE_COLUMNS)}) "
                      f"VALUES ({', '.join('?' * len(COLLECTIVE_COLUMNS))})")
_PHASE_STATS = ("INSERT INTO phase_stats VALUES (?1, 1, ?2) ON CONFLICT (name) DO UPDATE SET "
                "count = count + 1, max = MAX(max, excluded.max)")
_PHASE_HIST = ("INSERT INTO phase_hist VALUES (?1, ?2, 1, ?3) ON CONFLICT (name, bin) DO UPDATE "
               "SET count = count + 1, total = total + excluded.total")


_PEAK_COLUMNS = ("peak_rss_bytes", "peak_gpu_memory_bytes", "peak_cuda_allocated_bytes",
                 "peak_cuda_reserved_bytes", "cuda_alloc_retries", "cuda_ooms")
_WATERMARK_UPSERT = (
    "INSERT INTO watermarks VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (rank, phase) DO UPDATE "
    "SET " + ", ".join(f"{c} = MAX(COALESCE({c}, excluded.{c}), COALESCE(excluded.{c}, {c}))"
                       for c in _PEAK_COLUMNS))
_GPU_PHASE_UPSERT = (
    "INSERT INTO gpu_phase_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (phase) DO UPDATE "
    "SET gpu_seconds = gpu_seconds + excluded.gpu_seconds, " + ", ".join(
        f"{c} = CASE WHEN excluded.{c} IS NULL THEN {c} ELSE COALESCE({c}, 0) + excluded.{c} END"
        for c in ("pcie_tx_bytes", "pcie_rx_bytes", "util_sum", "compute_sum")) +
    ", util_samples = util_samples + excluded.util_samples"
    ", compute_samples = compute_samples + excluded.compute_samples")


def _watermark_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A sample row's memory figures, for the peaks of its rank and phase."""
    value = dict(zip(SAMPLE_COLUMNS, row))
    allocated = value["cuda_peak_allocated"]
    return (value["rank"], value["phase"], value["rss_bytes"], value["gpu_memory_bytes"],
            allocated if allocated is not None else value["cuda_allocated"],
            value["cuda_reserved"], value["cuda_alloc_retries"], value["cuda_ooms"])


def _newest(new: list[Any], cap: int) -> list[Any]:
    """The newest ``cap`` of the new collectives (oldest first), and any older pending one."""
    if len(new) <= cap:
        return new
    return [c for c in new[:len(new) - cap] if c.completed_at is None] + new[len(new) - cap:]


def _collective_row(rank: int, c: Any) -> tuple[Any, ...]:
    return (rank, c.group, c.seq, c.op, c.numel, c.dtype, c.entered_at, c.completed_at)


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _finding_row(record: dict[str, Any]) -> tuple[Any, ...]:
    """A finding's record as its row: the JSON columns as text."""
    return tuple(json.dumps(record[c]) if c in _FINDING_JSON else record[c]
                 for c in FINDING_COLUMNS)


def _probe_row(p: ProbeRun) -> tuple[Any, ...]:
    return (p.probe, int(not p.ok), p.skipped, p.seconds, p.seconds, p.error)


def _sample_row(tick: Tick, s: HostSample) -> tuple[Any, ...]:
    agent = tick.agents.get(s.rank)
    cuda = agent.cuda if agent else None
    gpu_bytes = [p.used_bytes for g in tick.gpus for p in g.processes or ()
                 if p.rank == s.rank and p.used_bytes is not None]
    return (s.t, s.rank, s.cpu_seconds, s.rss_bytes, s.threads, s.status, s.host_available_bytes,
            agent.marker_seq if agent else None, agent.collective_seq if agent else None,
            "/".join(agent.phase_stack) if agent else "", s.cpu_percent,
            sum(gpu_bytes) if gpu_bytes else None,
            *((cuda.allocated, cuda.reserved, cuda.peak_allocated, cuda.alloc_retries, cuda.ooms,
               cuda.host_marker, cuda.gpu_marker, cuda.host_label, cuda.gpu_label)
              if cuda else (None,) * 9), s.children, s.children_cpu_percent, s.io_bps)


def _phase_of(tick: Tick, g: GpuSample) -> str | None:
    """The phase stack of the GPU's (first) rank, None where no rank of ours is on it."""
    ranks = g.ranks
    agent = tick.agents.get(ranks[0]) if ranks else None
    return "/".join(agent.phase_stack) if agent else None


def _gpu_row(tick: Tick, g: GpuSample) -> tuple[Any, ...]:
    return (g.t, g.index, g.uuid, g.name, g.memory_used, g.memory_total, g.util_gpu,
            g.util_memory, g.pcie_tx_bps, g.pcie_rx_bps, g.power_w,
            len(g.processes) if g.processes is not None else None, json.dumps(list(g.ranks)),
            _phase_of(tick, g), g.util_compute)
