"""The run directory ``watch`` would use: would it refuse it, which filesystem it is on (and so
which journal the run database uses), how much room is left."""
from __future__ import annotations

import shutil
from pathlib import Path

from stalldoc.doctor.model import OK, PROBLEM, WARNING, Check
from stalldoc.errors import StalldocError
from stalldoc.run.rundir import refusal, resolved
from stalldoc.store.journal import choose_journal

DEFAULT_ROOT = Path("stalldoc-runs")
LOW_SPACE = 1 << 30   # bytes: under this free, a long run's database may fill it
RULES = ("made mode 0700 without following a link; every directory above it writable only by "
         "you or root, or sticky; an existing one must be yours and empty")


def check_run_dir(run_dir: Path | None) -> Check:
    """``run_dir`` as given to watch (None: watch's default, a new directory below
    ./stalldoc-runs)."""
    target = run_dir if run_dir is not None else DEFAULT_ROOT / "doctor-new-run"
    try:
        where = resolved(target)
        why = refusal(target)
    except (StalldocError, OSError) as exc:
        message = exc.message if isinstance(exc, StalldocError) else str(exc)
        return Check("run-dir", PROBLEM, message, "give --run-dir a path of yours")
    shown = where if run_dir is not None else where.parent / "<UTC time>-<id>"
    existing = _existing(where)
    journal = choose_journal(existing)
    free = shutil.disk_usage(existing).free
    facts = {"path": str(shown), "filesystem": journal.filesystem or "unknown",
             "journal": journal.mode, "free_bytes": free, "rules": RULES}
    if why is not None:
        return Check("run-dir", PROBLEM, f"watch would refuse it: {why}",
                     "give --run-dir a new path below a directory only you can write", facts)
    place = (f"{shown} on {journal.filesystem or 'an unknown filesystem'} "
             f"({free / 2**30:.1f} GiB free), journal {journal.mode.upper()}")
    if free < LOW_SPACE:
        return Check("run-dir", WARNING, f"{place}: under 1 GiB free, a long run's database "
                     "may fill it", "give --run-dir a filesystem with room", facts)
    note = f"; {journal.reason}" if journal.reason else ""
    return Check("run-dir", OK, place + note, facts=facts)


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what the filesystem questions are about)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
