"""Read a run directory into the report document (the JSON contract of ``stalldoc report``)."""
from __future__ import annotations

import json
import os
import sqlite3
import statistics
from pathlib import Path
from typing import Any

from stalldoc.errors import RunDirError
from stalldoc.report import telemetry
from stalldoc.store import phase_hist
from stalldoc.store.reader import open_reader
from stalldoc.store.schema import SCHEMA_VERSION


def _rows(conn: sqlite3.Connection, sql: str) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql)]


def _run(conn: sqlite3.Connection) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM run").fetchone()
    run = dict(row) if row else {}
    run["command"] = json.loads(run.get("command") or "[]")
    run["agent"] = bool(run.get("agent"))
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    run["schema_version"] = int(meta.get("schema_version", SCHEMA_VERSION))
    run["agent_startup"] = json.loads(meta["agent_startup"]) if "agent_startup" in meta else None
    run["dropped_log_lines"] = int(meta.get("dropped_log_lines", 0))
    run["pruned_log_lines"] = int(meta.get("pruned_log_lines", 0))
    run["pruned_stall_stacks"] = int(meta.get("pruned_stall_stacks", 0))
    run["journal_mode"] = meta.get("journal_mode", "wal")
    run["tick_errors"] = int(meta.get("tick_errors", 0))
    run["flight_recorder"] = json.loads(meta["flight_recorder"]) \
        if "flight_recorder" in meta else None
    return run


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def phase_summary(conn: sqlite3.Connection) -> dict[str, dict[str, float]]:
    """Per phase name: count, median, p95 and max duration in seconds over all ranks."""
    if telemetry.version(conn) >= 4:
        bins: dict[str, list[tuple[int, int, float]]] = {}
        for name, b, count, total in conn.execute("SELECT name, bin, count, total FROM phase_hist"):
            bins.setdefault(name, []).append((b, count, total))
        return {name: phase_hist.summary(count, maximum, bins.get(name, []))
                for name, count, maximum in
                conn.execute("SELECT name, count, max FROM phase_stats ORDER BY name")}
    durations: dict[str, list[float]] = {}
    for row in conn.execute("SELECT name, ended_at - started_at AS d FROM phases"):
        durations.setdefault(row["name"], []).append(row["d"])
    return {name: {"count": len(v), "median": round(statistics.median(v), 4),
                   "p95": round(_p95(v), 4), "max": round(max(v), 4)}
            for name, v in sorted(durations.items())}


def _decoded(conn: sqlite3.Connection, sql: str, *json_fields: str) -> list[dict[str, Any]]:
    """Rows as dicts, with the named JSON columns decoded."""
    rows = _rows(conn, sql)
    for row in rows:
        for name in json_fields:
            row[name] = json.loads(row.get(name) or "{}")   # absent in older schemas
    return rows


def flight_dumps(run_dir: Path) -> list[str]:
    """The Flight Recorder dumps in the run directory (``flight/rank_<N>``, what torchfrtrace
    reads), relative to it, by rank."""
    folder = run_dir / "flight"
    try:
        names = [n for n in os.listdir(folder) if n.startswith("rank_") and n[5:].isdigit()]
    except OSError:
        return []
    return [f"flight/{n}" for n in sorted(names, key=lambda n: int(n[5:]))]


def build_report(run_dir: Path) -> dict[str, Any]:
    """The report document of RUN_DIR; a damaged run is a RunDirError (one line, exit 1)."""
    try:
        with open_reader(run_dir) as conn:
            return {**_document(conn), "flight_dumps": flight_dumps(run_dir)}
    except (ValueError, KeyError, TypeError) as exc:   # bad JSON or values in a column
        raise RunDirError(f"{run_dir}: damaged run database ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from exc


def _document(conn: sqlite3.Connection) -> dict[str, Any]:
    return {"run": _run(conn),
            "ranks": _decoded(conn, "SELECT * FROM ranks ORDER BY rank, first_seen", "cmdline"),
            "stalls": _decoded(conn, "SELECT * FROM stalls ORDER BY id", "ranks", "phases",
                               "work"),
            "findings": _decoded(conn, "SELECT * FROM findings ORDER BY id", "ranks",
                                 "evidence"),
            "stacks": _decoded(conn, "SELECT * FROM stacks ORDER BY t, rank", "threads"),
            "phases": phase_summary(conn),
            "host": telemetry.host(conn),
            "gpus": telemetry.gpus(conn),
            "gpu_phases": telemetry.gpu_phases(conn),
            "watermarks": telemetry.watermarks(conn),
            "probes": telemetry.probes(conn),
            "timeseries": telemetry.timeseries(conn)}
