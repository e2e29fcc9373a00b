"""The telemetry parts of the report: time series, memory watermarks, GPUs, PCIe traffic by
phase, node memory and probe health. Each reads the run database with SQL and returns plain JSON
values."""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from stalldoc.store.retention import weighted_mean

MAX_POINTS = 1000   # per rank / per GPU in the time series; longer runs are thinned evenly

_RANK_SERIES = ("t, rank, status, phase, cpu_percent, rss_bytes, gpu_memory_bytes, "
                "cuda_allocated, cuda_reserved, cuda_host_marker, cuda_gpu_marker")
_GPU_SERIES = ("t, gpu, memory_used, memory_total, util_gpu, util_memory, pcie_tx_bps, "
               "pcie_rx_bps, power_w, processes, ranks, phase")
_NODE_SERIES = "t, available_bytes, total_bytes, swap_in_bps, swap_out_bps, load1, cores"
_PEAKS = ("MAX(rss_bytes) AS peak_rss_bytes, MAX(gpu_memory_bytes) AS peak_gpu_memory_bytes, "
          "MAX(COALESCE(cuda_peak_allocated, cuda_allocated)) AS peak_cuda_allocated_bytes, "
          "MAX(cuda_reserved) AS peak_cuda_reserved_bytes, "
          "MAX(cuda_alloc_retries) AS cuda_alloc_retries, MAX(cuda_ooms) AS cuda_ooms")


def _rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql, args)]


def version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0])


def _thinned(conn: sqlite3.Connection, columns: str, table: str, key: str) -> list[dict[str, Any]]:
    """Rows of ``table`` ordered by key and time, at most MAX_POINTS per value of ``key``
    (every stride-th row), thinned in SQL so a long run is never loaded whole."""
    return _rows(conn, f"""
        SELECT {columns} FROM (
            SELECT {columns}, ROW_NUMBER() OVER (PARTITION BY {key} ORDER BY t) - 1 AS i,
                   COUNT(*) OVER (PARTITION BY {key}) AS c FROM {table})
        WHERE i % ((c + {MAX_POINTS - 1}) / {MAX_POINTS}) = 0 ORDER BY {key}, t""")


def _bucketed(conn: sqlite3.Connection, columns: str, table: str, key: str) -> list[dict[str, Any]]:
    """Rows of ``table`` ordered by key and time, the last of each of MAX_POINTS equal spans of
    the run per value of ``key`` (so the latest row is always there): even in time, where the
    rows are not (schema 4 keeps full resolution around events and one row a minute
    elsewhere)."""
    lo, hi = conn.execute(f"SELECT MIN(t), MAX(t) FROM {table}").fetchone()
    if lo is None:
        return []
    span = (hi - lo) / (MAX_POINTS - 1) or 1.0    # spans 0 .. MAX_POINTS - 1
    return _rows(conn, f"SELECT {columns} FROM {table} WHERE rowid IN (SELECT MAX(rowid) FROM "
                       f"{table} GROUP BY {key}, CAST((t - ?) / ? AS INTEGER)) ORDER BY {key}, t",
                 lo, span)


def timeseries(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """At most about MAX_POINTS points per rank, GPU and for the node."""
    thin = _bucketed if version(conn) >= 4 else _thinned
    gpus = thin(conn, _GPU_SERIES + (", util_compute" if version(conn) >= 7 else ""),
                "gpu_samples", "gpu")
    for row in gpus:
        row["ranks"] = json.loads(row["ranks"])
    return {"ranks": thin(conn, _RANK_SERIES, "samples", "rank"),
            "gpus": gpus,
            "node": thin(conn, _NODE_SERIES, "node_samples", "'node'")}


_SUMMED_PEAKS = ("MAX(peak_rss_bytes) AS peak_rss_bytes, "
                 "MAX(peak_gpu_memory_bytes) AS peak_gpu_memory_bytes, "
                 "MAX(peak_cuda_allocated_bytes) AS peak_cuda_allocated_bytes, "
                 "MAX(peak_cuda_reserved_bytes) AS peak_cuda_reserved_bytes, "
                 "MAX(cuda_alloc_retries) AS cuda_alloc_retries, MAX(cuda_ooms) AS cuda_ooms")


def watermarks(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """Peak host and GPU memory per rank over the run, and per rank and phase (schema 4: as
    summed per tick, exact whatever was downsampled since)."""
    if version(conn) < 4:
        return watermarks_from_samples(conn)
    return {"run": _rows(conn, f"SELECT rank, {_SUMMED_PEAKS} FROM watermarks GROUP BY rank "
                               "ORDER BY rank"),
            "phases": _rows(conn, f"SELECT phase, rank, {_SUMMED_PEAKS} FROM watermarks "
                                  "WHERE phase != '' GROUP BY phase, rank ORDER BY phase, rank")}


def watermarks_from_samples(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """The same from every sample (schemas 2 and 3, which keep them all)."""
    return {"run": _rows(conn, f"SELECT rank, {_PEAKS} FROM samples GROUP BY rank ORDER BY rank"),
            "phases": _rows(conn, f"SELECT phase, rank, {_PEAKS} FROM samples WHERE phase != '' "
                                  "GROUP BY phase, rank ORDER BY phase, rank")}


def gpus(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each GPU over the run: its memory peak, mean utilisation, and who used it."""
    out = _rows(conn, "SELECT gpu, MAX(uuid) AS uuid, MAX(name) AS name, "
                      "MAX(memory_total) AS memory_total, MAX(memory_used) AS peak_memory_used, "
                      f"ROUND({_mean(conn, 'util_gpu')}, 1) AS util_gpu_mean, "
                      "MAX(processes) AS max_processes, "
                      f"{_compute_mean(conn)} AS util_compute_mean, "
                      "MAX(power_w) AS peak_power_w FROM gpu_samples GROUP BY gpu ORDER BY gpu")
    for gpu in out:
        ranks: set[int] = set()
        for (text,) in conn.execute("SELECT DISTINCT ranks FROM gpu_samples WHERE gpu = ?",
                                    (gpu["gpu"],)):
            ranks.update(json.loads(text))
        gpu["ranks"] = sorted(ranks)
    return out


def _mean(conn: sqlite3.Connection, column: str) -> str:
    """The SQL mean of ``column`` over samples, each downsampled row weighted by the samples it
    stands for (schema 4; earlier rows are one sample each)."""
    return f"AVG({column})" if version(conn) < 4 else weighted_mean(column)


def _compute_mean(conn: sqlite3.Connection) -> str:
    """The mean share of time a kernel ran (schema 7; NULL before: not recorded)."""
    return f"ROUND({weighted_mean('util_compute')}, 1)" if version(conn) >= 7 else "NULL"


def gpu_phases(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """PCIe bytes moved and mean GPU utilisation per phase of the GPU's rank (rate x interval;
    schema 4: summed per tick)."""
    if version(conn) < 4:
        return gpu_phases_from_samples(conn)
    compute = ("ROUND(compute_sum / NULLIF(compute_samples, 0), 1)" if version(conn) >= 7
               else "NULL")
    return _rows(conn, f"""
        SELECT phase, ROUND(gpu_seconds, 3) AS gpu_seconds,
               CAST(pcie_tx_bytes AS INTEGER) AS pcie_tx_bytes,
               CAST(pcie_rx_bytes AS INTEGER) AS pcie_rx_bytes,
               ROUND(util_sum / NULLIF(util_samples, 0), 1) AS util_gpu_mean,
               {compute} AS util_compute_mean
        FROM gpu_phase_stats ORDER BY phase""")


def gpu_phases_from_samples(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The same from every GPU sample (schemas 2 and 3, which keep them all; a later one's
    samples before any were downsampled)."""
    compute = "util_compute" if version(conn) >= 7 else "NULL AS util_compute"
    return _rows(conn, f"""
        WITH s AS (SELECT phase, util_gpu, {compute}, pcie_tx_bps, pcie_rx_bps,
                          t - LAG(t) OVER (PARTITION BY gpu ORDER BY t) AS dt
                   FROM gpu_samples)
        SELECT COALESCE(phase, '') AS phase, ROUND(SUM(dt), 3) AS gpu_seconds,
               CAST(SUM(pcie_tx_bps * dt) AS INTEGER) AS pcie_tx_bytes,
               CAST(SUM(pcie_rx_bps * dt) AS INTEGER) AS pcie_rx_bytes,
               ROUND(AVG(util_gpu), 1) AS util_gpu_mean,
               ROUND(AVG(util_compute), 1) AS util_compute_mean
        FROM s WHERE dt IS NOT NULL GROUP BY COALESCE(phase, '') ORDER BY phase""")


def host(conn: sqlite3.Connection) -> dict[str, Any]:
    """The node over the run: its lowest available memory, swap traffic and load."""
    row = conn.execute("SELECT MIN(available_bytes) AS min_available_bytes, "
                       "MAX(total_bytes) AS total_bytes, MAX(swap_in_bps) AS peak_swap_in_bps, "
                       "MAX(swap_out_bps) AS peak_swap_out_bps, MAX(load1) AS peak_load1, "
                       "MAX(cores) AS cores FROM node_samples").fetchone()
    return dict(row)


def _probe_runs(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each probe's runs, failures, skipped samples, mean / max seconds and last error."""
    if version(conn) >= 4:
        return _rows(conn, "SELECT probe, 1 AS available, '' AS unavailable, runs, failures, "
                           "skipped, total_seconds / runs AS mean_seconds, max_seconds, last_error "
                           "FROM probe_stats")
    out = _rows(conn, "SELECT probe, 1 AS available, '' AS unavailable, COUNT(*) AS runs, "
                      "SUM(1 - ok) AS failures, 0 AS skipped, AVG(seconds) AS mean_seconds, "
                      "MAX(seconds) AS max_seconds FROM probe_runs GROUP BY probe")
    for probe in out:
        last = conn.execute("SELECT error FROM probe_runs WHERE probe = ? AND ok = 0 "
                            "ORDER BY t DESC LIMIT 1", (probe["probe"],)).fetchone()
        probe["last_error"] = last[0] if last else ""
    return out


def probes(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each probe: available or why not, runs, failures, skipped samples, mean and max seconds,
    its last error."""
    out = _probe_runs(conn)
    for key, why in conn.execute("SELECT key, value FROM meta WHERE key LIKE 'unavailable:%'"):
        out.append({"probe": key.split(":", 1)[1], "available": 0, "unavailable": why, "runs": 0,
                    "failures": 0, "skipped": 0, "mean_seconds": None, "max_seconds": None,
                    "last_error": ""})
    for probe in out:
        probe["available"] = bool(probe["available"])
    return sorted(out, key=lambda p: p["probe"])
