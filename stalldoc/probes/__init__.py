"""A stage of the sidecar: the probes, one file each (host, NVML and GPM, the process
tree, agents' state files, py-spy stacks and the faulthandler fallback, exits, connections,
Flight Recorder dumps, versions). A probe samples what it can and raises ProbeUnavailable (with
the reason) when it cannot work at all; the watcher then switches it off instead of failing.

May import: ``model``, ``agent`` (what it publishes), ``analysis`` (to read a Flight Recorder
dump), ``errors``, ``private_files``, ``engines`` (what an engine's processes are called).
"""
from __future__ import annotations


class ProbeUnavailable(Exception):
    """The probe cannot run here; the message says why."""
