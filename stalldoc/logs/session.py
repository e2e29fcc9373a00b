"""The logs of a job nobody watched, read as the watcher reads a live job's output.

The files' lines are merged on one clock (each file's own order kept) and handed to the tick
rules a second of log time at a time (at most ``BATCH`` lines), as the watcher's ticks hand
them what the job printed since the last: an event (a log rule's finding) is opened once and
counted when its line repeats. The findings are stored as a run (``--run-dir``, else a
directory removed after the report), with what was read (``logs_read``), and rendered by the
report format asked for.
"""
from __future__ import annotations

import heapq
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from stalldoc.findings.ledger import Entry, Ledger
from stalldoc.logs.files import LogFile, LogInputError, Read
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.report.formats import reporter
from stalldoc.report.read import read_report
from stalldoc.report.text import read_summary
from stalldoc.rules import SETTLE, STICKY, run_rules
from stalldoc.run.options import make_run_dir
from stalldoc.store.db import RunStore

TICK = 1.0          # seconds of log time one pass of the rules reads
BATCH = 2_000       # lines at most one pass reads (a log without stamps has one time)
KEEP_LINES = 2_000  # the first and the last lines kept as the run's log
NODE = "saved logs"


@dataclass(frozen=True)
class LogsOptions:
    files: tuple[Path, ...]
    fmt: str = "text"
    run_dir: Path | None = None


@dataclass(frozen=True)
class Outcome:
    """What was read, and the findings' entries as they ended."""

    read: tuple[Read, ...]
    entries: tuple[Entry, ...]
    lines: tuple[LogLine, ...]      # the first and last lines kept for the run's log


def read_logs(options: LogsOptions, err: TextIO = sys.stderr) -> str:
    """The report of the files' findings in ``options.fmt``; what was read said on ``err``."""
    files = [LogFile(path) for path in options.files]
    outcome = findings_of(files)
    if not any(r.lines for r in outcome.read):
        raise LogInputError(f"{', '.join(map(str, options.files))}: empty, nothing to read")
    for read in outcome.read:
        err.write(f"stalldoc: read {read_summary(read.as_json())}\n")
    run_dir = make_run_dir(options.run_dir) if options.run_dir else _scratch()
    try:
        store_run(run_dir, [str(p) for p in options.files], outcome)
        return reporter(options.fmt).render(read_report([run_dir]))
    finally:
        if options.run_dir is None:
            shutil.rmtree(run_dir.parent, ignore_errors=True)


def findings_of(files: list[LogFile]) -> Outcome:
    """Every file read, its lines passed to the tick rules in order of time."""
    ledger = Ledger(STICKY, SETTLE)
    entries: dict[int, Entry] = {}
    kept: list[LogLine] = []
    merged = heapq.merge(*(f.lines() for f in files), key=lambda line: line.t)
    for batch in batches(merged):
        now = batch[-1].t
        changes = ledger.tick(now, run_rules(Window(now, (), log=batch), "tick"))
        entries.update((e.id, e) for e in changes.entries)
        kept = _keep(kept, batch)
    return Outcome(tuple(f.read for f in files), tuple(entries[i] for i in sorted(entries)),
                   tuple(kept))


def batches(lines: Iterable[LogLine]) -> Iterator[tuple[LogLine, ...]]:
    """The lines in passes of ``TICK`` seconds of their time, ``BATCH`` lines at most."""
    batch: list[LogLine] = []
    for line in lines:
        if batch and (line.t - batch[0].t >= TICK or len(batch) >= BATCH):
            yield tuple(batch)
            batch = []
        batch.append(line)
    if batch:
        yield tuple(batch)


def _keep(kept: list[LogLine], batch: tuple[LogLine, ...]) -> list[LogLine]:
    """The first ``KEEP_LINES`` lines and the last ``KEEP_LINES``: the run's log."""
    kept = kept + list(batch)
    if len(kept) > 3 * KEEP_LINES:
        kept = kept[:KEEP_LINES] + kept[-KEEP_LINES:]
    return kept


def store_run(run_dir: Path, paths: list[str], outcome: Outcome) -> None:
    """The findings stored as a run of ``stalldoc logs``."""
    times = [t for r in outcome.read for t in (r.first_at, r.last_at) if t is not None]
    store = RunStore(run_dir)
    try:
        store.start_run(run_dir.name, ["stalldoc", "logs", *paths], NODE,
                        min(times, default=time.time()), 0.0, False)
        store.set_meta("logs_read", json.dumps([r.as_json() for r in outcome.read]))
        store.add_logs(list(outcome.lines))
        store.put_findings(outcome.entries)
        store.end_run(max(times, default=time.time()), None)
    finally:
        store.close()


def _scratch() -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return make_run_dir(Path(tempfile.mkdtemp(prefix="stalldoc-logs-")) / f"logs-{stamp}")
