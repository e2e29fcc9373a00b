"""The typed run reader: one place that opens a run directory of any readable schema version
and returns its frozen records (``records.py``); several directories, or one holding several
nodes' runs, become one merged ``Report``."""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

from stalldoc.errors import RunDirError
from stalldoc.findings.ledger import OPEN, RESOLVED
from stalldoc.model.stacks import Frame, ThreadStack, as_written
from stalldoc.report import telemetry
from stalldoc.report.phases import phase_summary, step_share_records
from stalldoc.report.records import (CollectiveSpan, FindingRecord, GpuPhase, GpuPoint,
                                     GpuSummary, HostSummary, NodePoint, PhaseSpan, PhaseStats,
                                     ProbeHealth, RankPoint, RankRecord, Report, RunInfo,
                                     RunRecord, StackRecord, StallRecord, TimeSeries, Watermark)
from stalldoc.store.reader import open_reader
from stalldoc.store.schema import DB_NAME, SCHEMA_VERSION

T = TypeVar("T")
MAX_SPANS = 20000   # phase and collective spans per run: the latest ones


def record(cls: type[T], row: Mapping[str, Any], **extra: Any) -> T:
    """``cls`` from the row's columns it has a field for, ``extra`` (decoded values) taking
    precedence (columns an older schema lacks take the field's default; columns a newer one
    added are ignored)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in {**row, **extra}.items() if k in names})


def _json(text: Any, default: Any) -> Any:
    return json.loads(text) if text else default


def _meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def run_info(conn: sqlite3.Connection) -> RunInfo:
    row = conn.execute("SELECT * FROM run").fetchone()
    run = dict(row) if row else {"id": "", "command": "[]", "node": "", "agent": 0}
    meta = _meta(conn)
    number = {k: int(meta.get(k, 0)) for k in ("dropped_log_lines", "pruned_log_lines",
                                               "pruned_stall_stacks", "tick_errors",
                                               "dropped_collectives")}
    watch_code = meta.get("watch_exit_code")
    return record(RunInfo, run, **number,
                  command=tuple(_json(run.get("command"), [])), agent=bool(run.get("agent")),
                  started_at=run.get("started_at"), ended_at=run.get("ended_at"),
                  exit_code=run.get("exit_code"), stall_timeout=run.get("stall_timeout"),
                  schema_version=int(meta.get("schema_version", SCHEMA_VERSION)),
                  agent_startup=_json(meta.get("agent_startup"), None),
                  journal_mode=meta.get("journal_mode", "wal"),
                  flight_recorder=_json(meta.get("flight_recorder"), None),
                  watch_exit_code=int(watch_code) if watch_code not in (None, "") else None,
                  ended_by=meta.get("ended_by") or None, on_stall=meta.get("on_stall") or None,
                  versions=_json(meta.get("versions"), {}),
                  launch=_json(meta.get("launch_plan"), None),
                  cluster=_json(meta.get("cluster"), None),
                  attached=_json(meta.get("attached"), None),
                  attempt=_json(meta.get("attempt"), None),
                  logs_read=_logs_read(meta.get("logs_read")))


def _logs_read(text: str | None) -> tuple[dict[str, Any], ...] | None:
    """What ``stalldoc logs`` read (None for any other run, or a damaged value)."""
    value = _json(text, None)
    if not isinstance(value, list):
        return None
    return tuple(item for item in value if isinstance(item, dict))


def _rows(conn: sqlite3.Connection, sql: str) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql)]


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


def ranks(conn: sqlite3.Connection, node: str) -> tuple[RankRecord, ...]:
    return tuple(record(RankRecord, row, cmdline=tuple(_json(row["cmdline"], [])), node=node)
                 for row in _rows(conn, "SELECT * FROM ranks ORDER BY rank, first_seen"))


def stalls(conn: sqlite3.Connection, node: str) -> tuple[StallRecord, ...]:
    return tuple(record(StallRecord, row, ranks=tuple(_json(row["ranks"], [])),
                        phases=_json(row.get("phases"), {}), work=_json(row.get("work"), {}),
                        node=node)
                 for row in _rows(conn, "SELECT * FROM stalls ORDER BY id"))


def findings(conn: sqlite3.Connection, node: str) -> tuple[FindingRecord, ...]:
    return tuple(record(FindingRecord, row, ranks=tuple(_json(row["ranks"], [])),
                        evidence=_json(row["evidence"], {}), node=node,
                        state=RESOLVED if row.get("resolved_at") is not None else OPEN)
                 for row in _rows(conn, "SELECT * FROM findings ORDER BY id"))


def thread(value: Mapping[str, Any]) -> ThreadStack:
    return ThreadStack(value["thread_id"], value.get("name"), bool(value.get("active")),
                       bool(value.get("owns_gil")),
                       as_written(tuple(Frame(f["function"], f["filename"], int(f["line"]))
                                        for f in value.get("frames", ()))))


def stacks(conn: sqlite3.Connection, node: str) -> tuple[StackRecord, ...]:
    return tuple(record(StackRecord, row, threads=tuple(thread(t) for t in
                                                        _json(row["threads"], [])), node=node)
                 for row in _rows(conn, "SELECT * FROM stacks ORDER BY t, rank"))


def spans(conn: sqlite3.Connection) -> tuple[PhaseSpan, ...]:
    rows = _rows(conn, f"SELECT * FROM (SELECT * FROM phases ORDER BY ended_at DESC LIMIT "
                       f"{MAX_SPANS}) ORDER BY rank, started_at")
    return tuple(record(PhaseSpan, row) for row in rows)


def collectives(conn: sqlite3.Connection) -> tuple[CollectiveSpan, ...]:
    if not _has_table(conn, "collectives"):
        return ()
    rows = _rows(conn, f"SELECT rank, grp AS \"group\", seq, op, numel, dtype, entered_at, "
                       f"completed_at FROM (SELECT * FROM collectives ORDER BY entered_at DESC "
                       f"LIMIT {MAX_SPANS}) ORDER BY rank, entered_at")
    return tuple(record(CollectiveSpan, row) for row in rows)


def timeseries(conn: sqlite3.Connection) -> TimeSeries:
    series = telemetry.timeseries(conn)
    return TimeSeries(tuple(record(RankPoint, row) for row in series["ranks"]),
                      tuple(record(GpuPoint, row, ranks=tuple(row["ranks"]))
                            for row in series["gpus"]),
                      tuple(record(NodePoint, row) for row in series["node"]))


def watermarks(conn: sqlite3.Connection) -> tuple[Watermark, ...]:
    marks = telemetry.watermarks(conn)
    return tuple(record(Watermark, row) for row in marks["run"] + marks["phases"])


def flight_dumps(run_dir: Path) -> tuple[str, ...]:
    """The Flight Recorder dumps in the run directory (``flight/rank_<N>``, what torchfrtrace
    reads), relative to it, by rank."""
    try:
        names = [n for n in os.listdir(run_dir / "flight")
                 if n.startswith("rank_") and n[5:].isdigit()]
    except OSError:
        return ()
    return tuple(f"flight/{n}" for n in sorted(names, key=lambda n: int(n[5:])))


def _record(conn: sqlite3.Connection, run_dir: Path, node: str | None) -> RunRecord:
    info = run_info(conn)
    label = node or info.node
    return RunRecord(
        str(run_dir), label, info, ranks(conn, label), stalls(conn, label),
        findings(conn, label), stacks(conn, label),
        {name: record(PhaseStats, s) for name, s in phase_summary(conn).items()},
        record(HostSummary, telemetry.host(conn)),
        tuple(record(GpuSummary, g, ranks=tuple(g["ranks"])) for g in telemetry.gpus(conn)),
        tuple(record(GpuPhase, p) for p in telemetry.gpu_phases(conn)), watermarks(conn),
        tuple(record(ProbeHealth, p) for p in telemetry.probes(conn)), timeseries(conn),
        spans(conn), collectives(conn), flight_dumps(run_dir), step_share_records(conn))


def read_run(run_dir: Path, node: str | None = None) -> RunRecord:
    """RUN_DIR's records; a damaged run is a RunDirError (one line, exit 1)."""
    try:
        with open_reader(run_dir) as conn:
            return _record(conn, run_dir, node)
    except (ValueError, KeyError, TypeError, IndexError) as exc:   # bad values in a column
        raise RunDirError(f"{run_dir}: damaged run database ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from exc


def node_runs(path: Path) -> list[Path]:
    """The run directories ``path`` stands for: itself when it holds a run database, else the
    subdirectories (one or two levels down) that do: one per node of a multi-node run."""
    try:
        if (path / DB_NAME).is_file() or not path.is_dir():
            return [path]
        found = sorted(p.parent for p in [*path.glob(f"*/{DB_NAME}"), *path.glob(f"*/*/{DB_NAME}")])
    except OSError:
        return [path]
    return found or [path]    # none: the single-run reader says what is missing


def _labels(runs: list[RunRecord]) -> list[str]:
    """Each run's node label: the node's label in its multi-node job ("node 1", as findings
    name it) when every run has one of its own; else its host name, with the directory's name
    where hosts repeat (several nodes simulated on one machine, or two runs of one node)."""
    nodes = [str((r.info.cluster or {}).get("label") or "") for r in runs]
    if all(nodes) and len(set(nodes)) == len(nodes):
        return nodes
    hosts = [r.info.node for r in runs]
    return [h if hosts.count(h) == 1 else f"{h}:{Path(r.path).name}" for h, r in zip(hosts, runs)]


def read_report(paths: Iterable[Path]) -> Report:
    """One report of every run the paths hold, ordered by node index, then start (several:
    merged)."""
    runs = [read_run(p) for path in paths for p in node_runs(Path(path))]
    runs.sort(key=lambda r: (_node_index(r), r.info.started_at or 0.0, r.path))
    if len(runs) > 1:
        runs = [relabel(r, label) for r, label in zip(runs, _labels(runs))]
    return Report(tuple(runs))


def _node_index(run: RunRecord) -> int:
    """The node's index in its multi-node job (-1 when unknown: such runs go by start)."""
    index = (run.info.cluster or {}).get("index")
    return index if isinstance(index, int) else -1


def relabel(run: RunRecord, node: str) -> RunRecord:
    """The run with ``node`` as its label, on it and on each of its rows."""
    def each(rows: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(replace(row, node=node) for row in rows)
    return replace(run, node=node, ranks=each(run.ranks), stalls=each(run.stalls),
                   findings=each(run.findings), stacks=each(run.stacks))
