"""Processes a job left behind when its command exited: which to end, which to leave alone."""
from __future__ import annotations

import os

import psutil


def split_leftovers(procs: list[psutil.Process], rank_sessions: set[int],
                    end_detached: bool) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(to end, to leave running). Ended: processes still in our session or in a rank's (a rank
    whose launcher died, its workers). Left running unless ``end_detached``: daemons that
    detached themselves into a session of their own that is not a rank's."""
    ours = os.getsid(0)
    attached, detached = [], []
    for proc in procs:
        try:
            sid = os.getsid(proc.pid)
        except OSError:
            continue   # gone already
        (attached if end_detached or sid == ours or sid in rank_sessions else detached).append(proc)
    return attached, detached


def describe(procs: list[psutil.Process], most: int = 8) -> str:
    """``123 (python), 456 (sleep) and 3 more``."""
    names = []
    for proc in procs[:most]:
        try:
            names.append(f"{proc.pid} ({proc.name()})")
        except psutil.Error:
            names.append(str(proc.pid))
    return ", ".join(names) + (f" and {len(procs) - most} more" if len(procs) > most else "")
