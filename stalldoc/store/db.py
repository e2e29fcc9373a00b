"""The run database: SQLite in WAL mode inside the run directory, with a schema version.

The watcher is the only writer (one connection, one thread); readers open it read-only and refuse
a database whose schema they do not know.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from stalldoc.errors import RunDirError
from stalldoc.model import (Finding, GpuSample, HostSample, RankExit, RankProcess, RankStacks,
                            StallEpisode)
from stalldoc.redact import redact_argv as redact
from stalldoc.sampling import Tick

SCHEMA_VERSION = 3
READABLE_VERSIONS = ("2", "3")   # 3 added stalls.work and the samples' work columns
DB_NAME = "run.db"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (id TEXT PRIMARY KEY, command TEXT NOT NULL, node TEXT NOT NULL,
                  started_at REAL NOT NULL, ended_at REAL, exit_code INTEGER,
                  stall_timeout REAL NOT NULL, agent INTEGER NOT NULL);
CREATE TABLE ranks (rank INTEGER NOT NULL, pid INTEGER NOT NULL, local_rank INTEGER,
                    cmdline TEXT NOT NULL, first_seen REAL NOT NULL, ended_at REAL,
                    exit_code INTEGER, signal INTEGER, exit_source TEXT,
                    PRIMARY KEY (rank, pid));
CREATE TABLE samples (t REAL NOT NULL, rank INTEGER NOT NULL, cpu_seconds REAL, rss_bytes INTEGER,
                      threads INTEGER, status TEXT, host_available_bytes INTEGER,
                      marker_seq INTEGER, collective_seq INTEGER, phase TEXT,
                      cpu_percent REAL, gpu_memory_bytes INTEGER, cuda_allocated INTEGER,
                      cuda_reserved INTEGER, cuda_peak_allocated INTEGER,
                      cuda_alloc_retries INTEGER, cuda_ooms INTEGER, cuda_host_marker INTEGER,
                      cuda_gpu_marker INTEGER, cuda_host_label TEXT, cuda_gpu_label TEXT,
                      children INTEGER, children_cpu_percent REAL, io_bps REAL);
CREATE INDEX samples_t ON samples (t);
CREATE TABLE node_samples (t REAL NOT NULL, available_bytes INTEGER, total_bytes INTEGER,
                           swap_in_bps REAL, swap_out_bps REAL, load1 REAL, cores INTEGER);
CREATE TABLE gpu_samples (t REAL NOT NULL, gpu INTEGER NOT NULL, uuid TEXT, name TEXT,
                          memory_used INTEGER, memory_total INTEGER, util_gpu INTEGER,
                          util_memory INTEGER, pcie_tx_bps REAL, pcie_rx_bps REAL, power_w REAL,
                          processes INTEGER, ranks TEXT NOT NULL, phase TEXT);
CREATE INDEX gpu_samples_t ON gpu_samples (gpu, t);
CREATE TABLE probe_runs (t REAL NOT NULL, probe TEXT NOT NULL, ok INTEGER NOT NULL,
                         seconds REAL NOT NULL, error TEXT NOT NULL);
CREATE TABLE stalls (id INTEGER PRIMARY KEY, started_at REAL NOT NULL, detected_at REAL NOT NULL,
                     ended_at REAL, threshold REAL NOT NULL, ranks TEXT NOT NULL,
                     phases TEXT NOT NULL DEFAULT '{}', work TEXT NOT NULL DEFAULT '{}');
CREATE TABLE stacks (stall_id INTEGER, rank INTEGER NOT NULL, pid INTEGER NOT NULL, t REAL NOT NULL,
                     method TEXT NOT NULL, error TEXT NOT NULL, threads TEXT NOT NULL);
CREATE TABLE findings (id INTEGER PRIMARY KEY, t REAL NOT NULL, stall_id INTEGER, code TEXT NOT NULL,
                       name TEXT NOT NULL, severity TEXT NOT NULL, ranks TEXT NOT NULL,
                       summary TEXT NOT NULL, evidence TEXT NOT NULL, fix TEXT NOT NULL,
                       trigger TEXT NOT NULL DEFAULT 'stall', updated_at REAL,
                       resolved_at REAL, occurrences INTEGER NOT NULL DEFAULT 1);
CREATE TABLE phases (rank INTEGER NOT NULL, name TEXT NOT NULL, started_at REAL NOT NULL,
                     ended_at REAL NOT NULL, PRIMARY KEY (rank, name, started_at));
CREATE TABLE logs (t REAL NOT NULL, stream TEXT NOT NULL, line TEXT NOT NULL);
"""

MAX_LOG_LINES = 200_000


class RunStore:
    """The watcher's writer."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / DB_NAME
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(_SCHEMA)
        self.conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self.log_lines = 0
        self.conn.commit()

    def start_run(self, run_id: str, argv: list[str], node: str, started_at: float,
                  stall_timeout: float, agent: bool) -> None:
        self.conn.execute("INSERT INTO run VALUES (?, ?, ?, ?, NULL, NULL, ?, ?)",
                          (run_id, json.dumps(redact(argv)), node, started_at, stall_timeout,
                           int(agent)))
        self.conn.commit()

    def probe_unavailable(self, probe: str, why: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"unavailable:{probe}", why))
        self.conn.commit()

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        self.conn.commit()

    def end_run(self, ended_at: float, exit_code: int | None) -> None:
        self.conn.execute("UPDATE run SET ended_at = ?, exit_code = ?", (ended_at, exit_code))
        self.conn.commit()

    def add_rank(self, rank: RankProcess, t: float) -> None:
        self.conn.execute("INSERT OR IGNORE INTO ranks (rank, pid, local_rank, cmdline, first_seen)"
                          " VALUES (?, ?, ?, ?, ?)", (rank.rank, rank.pid, rank.local_rank,
                                                      json.dumps(redact(list(rank.cmdline))), t))

    def rank_exit(self, exit: RankExit) -> None:
        self.conn.execute("UPDATE ranks SET ended_at = ?, exit_code = ?, signal = ?, exit_source = ?"
                          " WHERE rank = ? AND pid = ?", (exit.t, exit.exit_code, exit.signal,
                                                          exit.source, exit.rank, exit.pid))

    def add_tick(self, tick: Tick) -> None:
        """Everything one tick of the probes saw, committed together."""
        self.conn.executemany(f"INSERT INTO samples VALUES ({', '.join('?' * 24)})",
                              [_sample_row(tick, s) for s in tick.host.values()])
        if tick.node is not None:
            n = tick.node
            self.conn.execute("INSERT INTO node_samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (n.t, n.available_bytes, n.total_bytes, n.swap_in_bps,
                               n.swap_out_bps, n.load1, n.cores))
        self.conn.executemany(f"INSERT INTO gpu_samples VALUES ({', '.join('?' * 14)})",
                              [_gpu_row(tick, g) for g in tick.gpus])
        self.conn.executemany("INSERT INTO probe_runs VALUES (?, ?, ?, ?, ?)",
                              [(p.t, p.probe, int(p.ok), p.seconds, p.error) for p in tick.probes])
        for rank, agent in tick.agents.items():
            self.add_phases(rank, agent.phases)
        self.conn.commit()

    def add_phases(self, rank: int, phases: Iterable[Any]) -> None:
        self.conn.executemany("INSERT OR IGNORE INTO phases VALUES (?, ?, ?, ?)",
                              [(rank, p.name, p.started_at, p.ended_at) for p in phases])

    def add_logs(self, lines: list[Any]) -> None:
        room = MAX_LOG_LINES - self.log_lines
        if room <= 0 or not lines:
            return
        self.conn.executemany("INSERT INTO logs VALUES (?, ?, ?)",
                              [(x.t, x.stream, x.text) for x in lines[:room]])
        self.log_lines += min(room, len(lines))

    def save_stall(self, episode: StallEpisode) -> None:
        work = {str(r): {**asdict(w), "seen": w.describe()} for r, w in episode.work.items()}
        self.conn.execute("INSERT OR REPLACE INTO stalls VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (episode.id, episode.started_at, episode.detected_at, episode.ended_at,
                           episode.threshold, json.dumps(list(episode.ranks)),
                           json.dumps({str(r): p for r, p in episode.phases.items()}),
                           json.dumps(work)))
        self.conn.commit()

    def add_stacks(self, stall_id: int | None, stacks: Iterable[RankStacks]) -> None:
        self.conn.executemany("INSERT INTO stacks VALUES (?, ?, ?, ?, ?, ?, ?)", [
            (stall_id, s.rank, s.pid, s.t, s.method, s.error,
             json.dumps([asdict(t) for t in s.threads])) for s in stacks])

    def add_findings(self, t: float, stall_id: int | None, findings: Iterable[Finding],
                     trigger: str = "stall") -> list[int]:
        """Store findings; returns their ids (in order)."""
        ids = []
        for f in findings:
            cursor = self.conn.execute(
                "INSERT INTO findings (t, stall_id, code, name, severity, ranks, summary, evidence,"
                " fix, trigger, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (t, stall_id, f.code, f.name, f.severity.value, json.dumps(list(f.ranks)),
                 f.summary, _json(f.evidence), f.fix, trigger, t))
            ids.append(int(cursor.lastrowid or 0))
        self.conn.commit()
        return ids

    def update_finding(self, row_id: int, t: float, finding: Finding, occurrences: int) -> None:
        """A finding that still holds: its latest summary, evidence and count."""
        self.conn.execute("UPDATE findings SET updated_at = ?, ranks = ?, summary = ?, "
                          "evidence = ?, occurrences = ? WHERE id = ?",
                          (t, json.dumps(list(finding.ranks)), finding.summary,
                           _json(finding.evidence), occurrences, row_id))

    def resolve_finding(self, row_id: int, t: float) -> None:
        self.conn.execute("UPDATE findings SET resolved_at = ? WHERE id = ?", (t, row_id))

    def resolve_stall_findings(self, stall_id: int, t: float) -> None:
        """Progress resumed: the findings of that stall no longer hold."""
        self.conn.execute("UPDATE findings SET resolved_at = ? WHERE stall_id = ? AND "
                          "resolved_at IS NULL", (t, stall_id))

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.commit()
        self.conn.close()


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


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


def _gpu_row(tick: Tick, g: GpuSample) -> tuple[Any, ...]:
    ranks = g.ranks
    agent = tick.agents.get(ranks[0]) if ranks else None
    return (g.t, g.index, g.uuid, g.name, g.memory_used, g.memory_total, g.util_gpu,
            g.util_memory, g.pcie_tx_bps, g.pcie_rx_bps, g.power_w,
            len(g.processes) if g.processes is not None else None, json.dumps(list(ranks)),
            "/".join(agent.phase_stack) if agent else None)


def open_reader(run_dir: Path) -> sqlite3.Connection:
    """Open a run database read-only, refusing what this version cannot read."""
    path = Path(run_dir) / DB_NAME
    if not Path(run_dir).is_dir():
        raise RunDirError(f"not a directory: {run_dir}")
    if not path.is_file():
        raise RunDirError(f"no stalldoc run database in {run_dir} (expected {DB_NAME})")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{path} is not a readable stalldoc database ({exc})") from exc
    if row is None or row[0] not in READABLE_VERSIONS:
        found = row[0] if row else "none"
        raise RunDirError(f"{path} has schema version {found}; this stalldoc reads "
                          f"{SCHEMA_VERSION}")
    return conn

