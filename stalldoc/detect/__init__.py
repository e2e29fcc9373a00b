"""Stall detection: per-rank progress and adaptive thresholds."""
