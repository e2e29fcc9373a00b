"""The run database's tables and their version.

Version 4 keeps the store bounded over days: old samples are downsampled into rows that stand for
``n`` samples (``samples.n``, ``gpu_samples.n``, ``node_samples.n``); what the report says per
phase is summed as it arrives (memory peaks per rank and phase into ``watermarks``, PCIe traffic
and utilisation per phase into ``gpu_phase_stats``, durations into ``phase_stats`` /
``phase_hist``), and probe runs into ``probe_stats``.
Version 5 adds ``collectives``: each collective call the agents' rings showed, once (``grp`` is
the process group's name: ``group`` is an SQL keyword).
Version 6 adds how each rank was known and its world (``ranks.source``, ``ranks.world``,
``ranks.world_rank``): mp.spawn, Lightning, Ray and MPI ranks are known from inside the process,
and a job of several torch.distributed worlds numbers each world's ranks after the others'.
Version 7 adds the share of time a kernel ran on each GPU (``gpu_samples.util_compute``, from
NVML's GPM; ``gpu_phase_stats.compute_sum`` / ``compute_samples``): NVML's ``util_gpu`` also
counts copies, so an H100 that only moves pinned memory reads 100 % there and 0 % here.
Version 8 adds ``phase_kinds``: each rank's time by kind of phase (``statefile.PHASE_KINDS``),
read near the start of each of its cycles (``analysis/phase_shares.py``), one row per kind.
Readers take versions 2 to 8.
"""
from __future__ import annotations

SCHEMA_VERSION = 8
READABLE_VERSIONS = ("2", "3", "4", "5", "6", "7", "8")   # 3 added stalls.work and the samples' work columns
DB_NAME = "run.db"

SAMPLE_COLUMNS = ("t", "rank", "cpu_seconds", "rss_bytes", "threads", "status",
                  "host_available_bytes", "marker_seq", "collective_seq", "phase", "cpu_percent",
                  "gpu_memory_bytes", "cuda_allocated", "cuda_reserved", "cuda_peak_allocated",
                  "cuda_alloc_retries", "cuda_ooms", "cuda_host_marker", "cuda_gpu_marker",
                  "cuda_host_label", "cuda_gpu_label", "children", "children_cpu_percent",
                  "io_bps")
GPU_COLUMNS = ("t", "gpu", "uuid", "name", "memory_used", "memory_total", "util_gpu",
               "util_memory", "pcie_tx_bps", "pcie_rx_bps", "power_w", "processes", "ranks",
               "phase", "util_compute")
COLLECTIVE_COLUMNS = ("rank", "grp", "seq", "op", "numel", "dtype", "entered_at", "completed_at")
NODE_COLUMNS = ("t", "available_bytes", "total_bytes", "swap_in_bps", "swap_out_bps", "load1",
                "cores")

DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (id TEXT PRIMARY KEY, command TEXT NOT NULL, node TEXT NOT NULL,
                  started_at REAL NOT NULL, ended_at REAL, exit_code INTEGER,
                  stall_timeout REAL NOT NULL, agent INTEGER NOT NULL);
CREATE TABLE ranks (rank INTEGER NOT NULL, pid INTEGER NOT NULL, local_rank INTEGER,
                    cmdline TEXT NOT NULL, first_seen REAL NOT NULL, ended_at REAL,
                    exit_code INTEGER, signal INTEGER, exit_source TEXT,
                    source TEXT, world TEXT, world_rank INTEGER,
                    PRIMARY KEY (rank, pid));
CREATE TABLE samples (t REAL NOT NULL, rank INTEGER NOT NULL, cpu_seconds REAL, rss_bytes INTEGER,
                      threads INTEGER, status TEXT, host_available_bytes INTEGER,
                      marker_seq INTEGER, collective_seq INTEGER, phase TEXT,
                      cpu_percent REAL, gpu_memory_bytes INTEGER, cuda_allocated INTEGER,
                      cuda_reserved INTEGER, cuda_peak_allocated INTEGER,
                      cuda_alloc_retries INTEGER, cuda_ooms INTEGER, cuda_host_marker INTEGER,
                      cuda_gpu_marker INTEGER, cuda_host_label TEXT, cuda_gpu_label TEXT,
                      children INTEGER, children_cpu_percent REAL, io_bps REAL,
                      n INTEGER NOT NULL DEFAULT 1);
CREATE INDEX samples_t ON samples (t);
CREATE TABLE node_samples (t REAL NOT NULL, available_bytes INTEGER, total_bytes INTEGER,
                           swap_in_bps REAL, swap_out_bps REAL, load1 REAL, cores INTEGER,
                           n INTEGER NOT NULL DEFAULT 1);
CREATE INDEX node_samples_t ON node_samples (t);
CREATE TABLE gpu_samples (t REAL NOT NULL, gpu INTEGER NOT NULL, uuid TEXT, name TEXT,
                          memory_used INTEGER, memory_total INTEGER, util_gpu INTEGER,
                          util_memory INTEGER, pcie_tx_bps REAL, pcie_rx_bps REAL, power_w REAL,
                          processes INTEGER, ranks TEXT NOT NULL, phase TEXT,
                          util_compute REAL, n INTEGER NOT NULL DEFAULT 1);
CREATE INDEX gpu_samples_t ON gpu_samples (gpu, t);
CREATE INDEX gpu_samples_time ON gpu_samples (t);
CREATE TABLE probe_stats (probe TEXT PRIMARY KEY, runs INTEGER NOT NULL, failures INTEGER NOT NULL,
                          skipped INTEGER NOT NULL, total_seconds REAL NOT NULL,
                          max_seconds REAL NOT NULL, last_error TEXT NOT NULL);
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
CREATE INDEX phases_ended ON phases (ended_at);
CREATE TABLE collectives (rank INTEGER NOT NULL, grp TEXT NOT NULL, seq INTEGER NOT NULL,
                          op TEXT NOT NULL, numel INTEGER NOT NULL, dtype TEXT NOT NULL,
                          entered_at REAL NOT NULL, completed_at REAL,
                          PRIMARY KEY (rank, grp, seq, entered_at));
CREATE INDEX collectives_entered ON collectives (entered_at);
CREATE TABLE phase_kinds (rank INTEGER NOT NULL, counted_at REAL NOT NULL, kind TEXT NOT NULL,
                          entries INTEGER NOT NULL, seconds REAL NOT NULL,
                          PRIMARY KEY (rank, counted_at, kind));
CREATE TABLE phase_stats (name TEXT PRIMARY KEY, count INTEGER NOT NULL, max REAL NOT NULL);
CREATE TABLE phase_hist (name TEXT NOT NULL, bin INTEGER NOT NULL, count INTEGER NOT NULL,
                         total REAL NOT NULL, PRIMARY KEY (name, bin));
CREATE TABLE logs (t REAL NOT NULL, stream TEXT NOT NULL, line TEXT NOT NULL);
CREATE TABLE watermarks (rank INTEGER NOT NULL, phase TEXT NOT NULL, peak_rss_bytes INTEGER,
                         peak_gpu_memory_bytes INTEGER, peak_cuda_allocated_bytes INTEGER,
                         peak_cuda_reserved_bytes INTEGER, cuda_alloc_retries INTEGER,
                         cuda_ooms INTEGER, PRIMARY KEY (rank, phase));
CREATE TABLE gpu_phase_stats (phase TEXT PRIMARY KEY, gpu_seconds REAL NOT NULL,
                              pcie_tx_bytes REAL, pcie_rx_bytes REAL, util_sum REAL,
                              util_samples INTEGER NOT NULL, compute_sum REAL,
                              compute_samples INTEGER NOT NULL DEFAULT 0);
"""
