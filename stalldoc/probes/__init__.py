"""Sidecar probes, one file each. A probe samples what it can and raises ProbeUnavailable (with
the reason) when it cannot work at all; the watcher then switches it off instead of failing."""
from __future__ import annotations


class ProbeUnavailable(Exception):
    """The probe cannot run here; the message says why."""
