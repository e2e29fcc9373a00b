"""The telemetry parts of the report: time series, memory watermarks, GPUs, PCIe traffic by
phase, node memory and probe health. Each reads the run database with SQL and returns plain JSON
values."""
from __future__ import annotations

import json
import sqlite3
from typing import Any

MAX_POINTS = 1000   # per rank / per GPU in the time series; longer runs are thinned evenly

_RANK_SERIES = ("t, rank, status, phase, cpu_percent, rss_bytes, gpu_memory_bytes, "
                "cuda_allocated, cuda_reserved, cuda_host_marker, cuda_gpu_marker")
_GPU_SERIES = ("t, gpu, memory_used, memory_total, util_gpu, util_memory, pcie_tx_bps, "
               "pcie_rx_bps, power_w, processes, ranks, phase")
_PEAKS = ("MAX(rss_bytes) AS peak_rss_bytes, MAX(gpu_memory_bytes) AS peak_gpu_memory_bytes, "
          "MAX(COALESCE(cuda_peak_allocated, cuda_allocated)) AS peak_cuda_allocated_bytes, "
          "MAX(cuda_reserved) AS peak_cuda_reserved_bytes, "
          "MAX(cuda_alloc_retries) AS cuda_alloc_retries, MAX(cuda_ooms) AS cuda_ooms")


def _rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql, args)]


def _thinned(conn: sqlite3.Connection, sql: str, key: str) -> list[dict[str, Any]]:
    """Rows of ``sql`` (ordered by key, t), at most MAX_POINTS per value of ``key``."""
    rows = _rows(conn, sql)
    counts: dict[Any, int] = {}
    for row in rows:
        counts[row[key]] = counts.get(row[key], 0) + 1
    seen: dict[Any, int] = {}
    out = []
    for row in rows:
        n = seen[row[key]] = seen.get(row[key], -1) + 1
        stride = -(-counts[row[key]] // MAX_POINTS)
        if n % stride == 0:
            out.append(row)
    return out


def timeseries(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    gpus = _thinned(conn, f"SELECT {_GPU_SERIES} FROM gpu_samples ORDER BY gpu, t", "gpu")
    for row in gpus:
        row["ranks"] = json.loads(row["ranks"])
    return {"ranks": _thinned(conn, f"SELECT {_RANK_SERIES} FROM samples ORDER BY rank, t", "rank"),
            "gpus": gpus,
            "node": [{k: v for k, v in row.items() if k != "one"} for row in
                     _thinned(conn, "SELECT *, 1 AS one FROM node_samples ORDER BY t", "one")]}


def watermarks(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """Peak host and GPU memory per rank over the run, and per rank and phase."""
    return {"run": _rows(conn, f"SELECT rank, {_PEAKS} FROM samples GROUP BY rank ORDER BY rank"),
            "phases": _rows(conn, f"SELECT phase, rank, {_PEAKS} FROM samples WHERE phase != '' "
                                  "GROUP BY phase, rank ORDER BY phase, rank")}


def gpus(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each GPU over the run: its memory peak, mean utilisation, and who used it."""
    out = _rows(conn, "SELECT gpu, MAX(uuid) AS uuid, MAX(name) AS name, "
                      "MAX(memory_total) AS memory_total, MAX(memory_used) AS peak_memory_used, "
                      "ROUND(AVG(util_gpu), 1) AS util_gpu_mean, MAX(processes) AS max_processes, "
                      "MAX(power_w) AS peak_power_w FROM gpu_samples GROUP BY gpu ORDER BY gpu")
    for gpu in out:
        ranks: set[int] = set()
        for (text,) in conn.execute("SELECT DISTINCT ranks FROM gpu_samples WHERE gpu = ?",
                                    (gpu["gpu"],)):
            ranks.update(json.loads(text))
        gpu["ranks"] = sorted(ranks)
    return out


def gpu_phases(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """PCIe bytes moved and mean GPU utilisation per phase of the GPU's rank (rate x interval)."""
    return _rows(conn, """
        WITH s AS (SELECT phase, util_gpu, pcie_tx_bps, pcie_rx_bps,
                          t - LAG(t) OVER (PARTITION BY gpu ORDER BY t) AS dt
                   FROM gpu_samples)
        SELECT COALESCE(phase, '') AS phase, ROUND(SUM(dt), 3) AS gpu_seconds,
               CAST(SUM(pcie_tx_bps * dt) AS INTEGER) AS pcie_tx_bytes,
               CAST(SUM(pcie_rx_bps * dt) AS INTEGER) AS pcie_rx_bytes,
               ROUND(AVG(util_gpu), 1) AS util_gpu_mean
        FROM s WHERE dt IS NOT NULL GROUP BY COALESCE(phase, '') ORDER BY phase""")


def host(conn: sqlite3.Connection) -> dict[str, Any]:
    """The node over the run: its lowest available memory, swap traffic and load."""
    row = conn.execute("SELECT MIN(available_bytes) AS min_available_bytes, "
                       "MAX(total_bytes) AS total_bytes, MAX(swap_in_bps) AS peak_swap_in_bps, "
                       "MAX(swap_out_bps) AS peak_swap_out_bps, MAX(load1) AS peak_load1, "
                       "MAX(cores) AS cores FROM node_samples").fetchone()
    return dict(row)


def probes(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each probe: available or why not, runs, failures, mean and max seconds, its last error."""
    out = _rows(conn, "SELECT probe, 1 AS available, '' AS unavailable, COUNT(*) AS runs, "
                      "SUM(1 - ok) AS failures, AVG(seconds) AS mean_seconds, "
                      "MAX(seconds) AS max_seconds FROM probe_runs GROUP BY probe")
    for probe in out:
        last = conn.execute("SELECT error FROM probe_runs WHERE probe = ? AND ok = 0 "
                            "ORDER BY t DESC LIMIT 1", (probe["probe"],)).fetchone()
        probe["last_error"] = last[0] if last else ""
    for key, why in conn.execute("SELECT key, value FROM meta WHERE key LIKE 'unavailable:%'"):
        out.append({"probe": key.split(":", 1)[1], "available": 0, "unavailable": why, "runs": 0,
                    "failures": 0, "mean_seconds": None, "max_seconds": None, "last_error": ""})
    for probe in out:
        probe["available"] = bool(probe["available"])
    return sorted(out, key=lambda p: p["probe"])
