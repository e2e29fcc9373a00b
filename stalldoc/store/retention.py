"""What the run database keeps over days, and how it forgets the rest.

- Samples (ranks, GPUs, node) stay at full resolution for the latest minutes (at least
  ``full_resolution_seconds``, and more than the stall threshold so a stall's lead-up is whole)
  and around every stall and finding; older ones are downsampled into one row per bucket
  (``bucket_seconds``) and rank / GPU. A downsampled row keeps the peaks (memory, counters, swap
  rates), the lowest available memory, the sample-weighted means of the other rates and of
  utilisation, the last status and phase, and how many samples it stands for (``n``). What the
  report says per phase (memory peaks, PCIe traffic) was summed per tick beforehand.
- Raw phase rows are dropped on the same schedule; their durations were summed into
  ``phase_stats`` / ``phase_hist`` when they arrived.
- Collective calls: each one the agents' rings showed, stored once, at most
  ``collectives_per_rank_tick`` new ones per rank and tick (the newest, and any still pending:
  a job can issue thousands a second). Kept for the latest ``collectives_seconds`` (at least
  the stall lead-up the watcher asks to keep) and from ``collectives_before`` a stall's start
  to its detection; one still pending stays.
- Stacks are kept for the first and the latest stalls.
- Log lines: the first ``log_head_bytes`` for good, then a rolling ``log_tail_bytes``.
"""
from __future__ import annotations

import sqlite3
from collections import deque
from dataclasses import dataclass, replace

Interval = tuple[float, float]


@dataclass(frozen=True)
class RetentionPolicy:
    bucket_seconds: float = 60.0
    full_resolution_seconds: float = 600.0
    around_before: float = 300.0        # full resolution kept before a stall's detection
    around_after: float = 60.0          # and after it
    finding_before: float = 120.0       # and around a finding's opening and resolution
    finding_after: float = 30.0
    log_head_bytes: int = 8 << 20
    log_tail_bytes: int = 56 << 20
    stacks_first_stalls: int = 20
    stacks_last_stalls: int = 30
    collectives_per_rank_tick: int = 8
    collectives_seconds: float = 120.0
    collectives_before: float = 60.0


def weighted_mean(column: str) -> str:
    """The SQL mean of ``column``, each row weighted by the samples it stands for (``n``)."""
    return (f"SUM({column} * n) * 1.0 / NULLIF(SUM(CASE WHEN {column} IS NOT NULL THEN n END), 0)")


# table -> (group key, {column: aggregate}, columns whose last value is kept)
_SAMPLES = ("rank", {
    "t": "MAX(t)", "rank": "rank", "cpu_seconds": "MAX(cpu_seconds)",
    "rss_bytes": "MAX(rss_bytes)", "threads": "MAX(threads)", "status": "MAX(last_status)",
    "host_available_bytes": "MIN(host_available_bytes)", "marker_seq": "MAX(marker_seq)",
    "collective_seq": "MAX(collective_seq)", "phase": "MAX(last_phase)",
    "cpu_percent": weighted_mean("cpu_percent"), "gpu_memory_bytes": "MAX(gpu_memory_bytes)",
    "cuda_allocated": "MAX(cuda_allocated)", "cuda_reserved": "MAX(cuda_reserved)",
    "cuda_peak_allocated": "MAX(cuda_peak_allocated)",
    "cuda_alloc_retries": "MAX(cuda_alloc_retries)", "cuda_ooms": "MAX(cuda_ooms)",
    "cuda_host_marker": "MAX(cuda_host_marker)", "cuda_gpu_marker": "MAX(cuda_gpu_marker)",
    "cuda_host_label": "MAX(last_cuda_host_label)", "cuda_gpu_label": "MAX(last_cuda_gpu_label)",
    "children": "MAX(children)", "children_cpu_percent": weighted_mean("children_cpu_percent"),
    "io_bps": weighted_mean("io_bps"), "n": "SUM(n)"}, ("status", "phase", "cuda_host_label",
                                                    "cuda_gpu_label"))
_GPUS = ("gpu", {
    "t": "MAX(t)", "gpu": "gpu", "uuid": "MAX(uuid)", "name": "MAX(name)",
    "memory_used": "MAX(memory_used)", "memory_total": "MAX(memory_total)",
    "util_gpu": weighted_mean("util_gpu"), "util_memory": weighted_mean("util_memory"),
    "util_compute": weighted_mean("util_compute"),
    "pcie_tx_bps": weighted_mean("pcie_tx_bps"), "pcie_rx_bps": weighted_mean("pcie_rx_bps"),
    "power_w": "MAX(power_w)", "processes": "MAX(processes)", "ranks": "MAX(last_ranks)",
    "phase": "MAX(last_phase)", "n": "SUM(n)"}, ("ranks", "phase"))
_NODE = ("", {
    "t": "MAX(t)", "available_bytes": "MIN(available_bytes)", "total_bytes": "MAX(total_bytes)",
    "swap_in_bps": "MAX(swap_in_bps)", "swap_out_bps": "MAX(swap_out_bps)",
    "load1": "MAX(load1)", "cores": "MAX(cores)", "n": "SUM(n)"}, ())
TABLES = {"samples": _SAMPLES, "gpu_samples": _GPUS, "node_samples": _NODE}


def _downsample_sql(table: str) -> str:
    key, aggregates, last = TABLES[table]
    bucket = "CAST(t / :bucket AS INTEGER)"
    group = f"{key}, b" if key else "b"
    lasts = "".join(f", FIRST_VALUE({c}) OVER w AS last_{c}" for c in last)
    partition = f"{key}, {bucket}" if key else bucket
    window = f" WINDOW w AS (PARTITION BY {partition} ORDER BY t DESC)" if last else ""
    columns = ", ".join(aggregates)
    return (f"WITH s AS (SELECT *, {bucket} AS b{lasts} FROM {table} "
            f"WHERE t >= :lo AND t < :hi AND rowid <= :top{window}) "
            f"INSERT INTO {table} ({columns}) SELECT {', '.join(aggregates.values())} "
            f"FROM s GROUP BY {group}")


def downsample(conn: sqlite3.Connection, table: str, lo: float, hi: float,
               bucket: float) -> int:
    """Replace the rows of ``table`` in [lo, hi) by one row per bucket and key; rows removed."""
    top = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]
    if top is None:
        return 0
    args = {"lo": lo, "hi": hi, "bucket": bucket, "top": top}
    added = conn.execute(_downsample_sql(table), args).rowcount
    removed = conn.execute(f"DELETE FROM {table} WHERE t >= :lo AND t < :hi AND rowid <= :top",
                           args).rowcount
    return removed - added


def protected(conn: sqlite3.Connection, policy: RetentionPolicy) -> list[Interval]:
    """Time spans kept at full resolution: a stall's lead-up to its detection and its end, and
    each finding's opening and resolution (not the hours a hang may last)."""
    before, after = policy.around_before, policy.around_after
    spans = []
    for start, detected, end in conn.execute("SELECT started_at, detected_at, ended_at FROM stalls"):
        spans.append((start - before, detected + after))
        if end is not None:
            spans.append((end - before, end + after))
    before, after = policy.finding_before, policy.finding_after
    for t, resolved in conn.execute("SELECT t, resolved_at FROM findings WHERE trigger != 'launch'"):
        spans.append((t - before, t + after))
        if resolved is not None:
            spans.append((resolved - before, resolved + after))
    return spans


def collective_windows(conn: sqlite3.Connection, policy: RetentionPolicy) -> list[Interval]:
    """Where collective calls are kept: around stalls and findings, from ``collectives_before``
    before them."""
    before = policy.collectives_before
    return protected(conn, replace(policy, around_before=before, finding_before=before))


def gaps(lo: float, hi: float, keep: list[Interval]) -> list[Interval]:
    """The parts of [lo, hi) outside every interval of ``keep``."""
    out, start = [], lo
    for a, b in sorted(keep):
        if b <= start or a >= hi:
            continue
        if a > start:
            out.append((start, a))
        start = max(start, b)
    if start < hi:
        out.append((start, hi))
    return out


def prune_stacks(conn: sqlite3.Connection, first: int, last: int) -> int:
    """Drop the stacks of stalls other than the first ``first`` and the latest ``last``; how
    many stalls lost theirs."""
    ids = [row[0] for row in conn.execute(
        "SELECT DISTINCT stall_id FROM stacks WHERE stall_id IS NOT NULL ORDER BY stall_id")]
    middle = ids[first:len(ids) - last] if len(ids) > first + last else []
    conn.executemany("DELETE FROM stacks WHERE stall_id = ?", [(i,) for i in middle])
    return len(middle)


class LogBudget:
    """Keeps the first ``head`` bytes of log lines, then a rolling ``tail`` of the latest."""

    def __init__(self, head: int, tail: int) -> None:
        self.head, self.tail = head, tail
        self.head_bytes = 0
        self.head_rowid = 0
        self.tail_bytes = 0
        self.batches: deque[tuple[int, int]] = deque()   # (last rowid, bytes) of tail batches
        self.pruned_lines = 0

    def added(self, conn: sqlite3.Connection, size: int) -> None:
        """A batch of ``size`` bytes was just inserted: account for it, drop the oldest tail."""
        last = conn.execute("SELECT MAX(rowid) FROM logs").fetchone()[0] or 0
        if self.head_bytes < self.head:
            self.head_bytes += size
            self.head_rowid = last
            return
        self.batches.append((last, size))
        self.tail_bytes += size
        while self.tail_bytes > self.tail and len(self.batches) > 1:
            rowid, dropped = self.batches.popleft()
            self.tail_bytes -= dropped
            self.pruned_lines += conn.execute(
                "DELETE FROM logs WHERE rowid > ? AND rowid <= ?",
                (self.head_rowid, rowid)).rowcount
