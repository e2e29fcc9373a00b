"""The ledger: the one owner of the findings of a run.

Every finding the watcher makes is an ``Entry`` here, with the moment that made it (its
*trigger*): ``launch`` (the command line, before the job starts), ``stall`` (a stall's diagnosis),
``exit`` (ranks that ended) or ``tick`` (the cheap rules, every tick). Each operation returns
``Changes``: the entries it opened, updated and resolved, from which the watcher stores rows,
prints and counts; the store and the metrics exporter read nothing else.

**Open** has one meaning: an entry is open while it has not been resolved (``state == "open"``,
``resolved_at is None``; in the store, ``resolved_at IS NULL``; in the metrics,
``stalldoc_findings_open``). What resolves an entry:

- a tick finding: the first tick it no longer holds (events, the findings of sticky rules,
  never resolve by silence: a repeat counts up, see ``events.py``); a finding about a trend
  over steps (``settle``: its rule's seconds), once it has not held for that long, so that one
  step under its threshold does not end it and the next open it again; or, at the job's end,
  its ranks' progress after it was last seen (``moved_on``);
- a stall's findings: the stall ending (progress resumed);
- an event printed as the job shut down, when the job then exited 0 (``shutdown``);
- an exit finding whose ranks the launcher started again (``recovered``).

Launch findings are never resolved, nor are exit findings but by a restart: the command line
and the dead ranks stay as they were. Exit findings are made once per (code, ranks); a later
judgement of the same ones (ranks that died after the first, settling) updates that entry in
place.

The ledger holds the open entries only; a resolved entry is handed back once in ``Changes``
(the store keeps it) and forgotten, so a run of days keeps its memory bounded. Entries are
numbered from 1 in the order they are opened: that number is their row's id in the store.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from stalldoc.findings.events import Key, key_of, printed_at_shutdown, repeated_event
from stalldoc.model.findings import SEVERITY_LEVEL, Finding, Severity

Trigger = Literal["launch", "stall", "exit", "tick"]
TRIGGERS: tuple[Trigger, ...] = ("launch", "stall", "exit", "tick")
OPEN, RESOLVED = "open", "resolved"
CodeSeverity = tuple[str, str]


@dataclass(frozen=True)
class Entry:
    """One finding of the run and its life."""

    id: int                          # 1, 2, ... in the order opened; its store row's id
    finding: Finding                 # as last seen (an event: its first occurrence, gathered)
    trigger: Trigger
    opened_at: float
    updated_at: float
    stall_id: int | None = None      # the stall it diagnosed (trigger "stall")
    resolved_at: float | None = None
    occurrences: int = 1             # ticks it was seen in (tick findings); 1 otherwise

    @property
    def state(self) -> str:
        """``open`` until resolved, then ``resolved``: the one definition of open."""
        return OPEN if self.resolved_at is None else RESOLVED

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


@dataclass(frozen=True)
class Changes:
    """What one operation did to the ledger."""

    opened: tuple[Entry, ...] = ()
    updated: tuple[Entry, ...] = ()
    resolved: tuple[Entry, ...] = ()

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry that changed, as it is now (for the store)."""
        return self.opened + self.updated + self.resolved

    def __bool__(self) -> bool:
        return bool(self.entries)


class Ledger:
    """The findings of one run; ``sticky``: the codes of the rules whose findings are events;
    ``settle``: the seconds a tick finding of these codes is kept open after it last held."""

    def __init__(self, sticky: frozenset[str] = frozenset(),
                 settle: Mapping[str, float] | None = None) -> None:
        self.sticky = sticky
        self.settle = dict(settle or {})
        self._open: dict[int, Entry] = {}       # by id, in the order opened
        self._ticks: dict[Key, int] = {}        # open tick findings: key -> id
        self._exits: dict[Key, int] = {}        # exit findings: (code, ranks) -> id
        self._opened: Counter[CodeSeverity] = Counter()
        self._next_id = 1
        self._attempts: list[float] = []   # when each attempt after the first began

    # ----- reading ----------------------------------------------------------------------------
    @property
    def attempt(self) -> int:
        """The job's attempt: 2 once its launcher restarted the ranks, and so on."""
        return 1 + len(self._attempts)

    def attempt_at(self, t: float) -> int:
        """The attempt that ran at time ``t``."""
        return 1 + sum(1 for began in self._attempts if began <= t)

    def open_entries(self, trigger: Trigger | None = None) -> tuple[Entry, ...]:
        """The open entries (of ``trigger``), in the order they were opened."""
        return tuple(e for e in self._open.values() if trigger in (None, e.trigger))

    def opened_counts(self) -> dict[CodeSeverity, int]:
        """Entries ever opened, by (code, severity): ``stalldoc_findings_total``."""
        return dict(self._opened)

    def open_counts(self) -> dict[CodeSeverity, int]:
        """Open entries, by (code, severity): ``stalldoc_findings_open``."""
        return dict(Counter(_code_severity(e.finding) for e in self._open.values()))

    # ----- opening ----------------------------------------------------------------------------
    def begin_attempt(self, attempt: int, now: float) -> bool:
        """The ranks run again in new processes: attempt ``attempt`` began ``now`` (False when
        it is no later than the one running)."""
        if attempt <= self.attempt:
            return False
        self._attempts += [now] * (attempt - self.attempt)
        return True

    def launch(self, now: float, findings: Iterable[Finding]) -> Changes:
        """The launch checks' findings."""
        return Changes(opened=tuple(self._add(f, "launch", now) for f in findings))

    def stall(self, now: float, stall_id: int, findings: Iterable[Finding]) -> Changes:
        """A stall's diagnosis: open until the stall ends."""
        return Changes(opened=tuple(self._add(self._in_attempt(f), "stall", now, stall_id)
                                    for f in findings))

    def exits(self, now: float, findings: Iterable[Finding]) -> Changes:
        """The exit rules' judgement of the ranks that ended so far: each (code, ranks) opened
        once; the same again, changed (later deaths named in it), updates that entry."""
        opened, updated = [], []
        for finding in map(self._in_attempt, findings):
            known = self._exits.get((finding.code, finding.ranks))
            if known is None:
                entry = self._add(finding, "exit", now)
                self._exits[(finding.code, finding.ranks)] = entry.id
                opened.append(entry)
            elif self._open[known].finding != finding:
                updated.append(self._put(dataclasses.replace(
                    self._open[known], finding=finding, updated_at=now)))
        return Changes(tuple(opened), tuple(updated))

    def tick(self, now: float, findings: Iterable[Finding], resolve: bool = True) -> Changes:
        """This tick's findings of the tick rules: new ones opened, those seen again updated
        (events gathered), those gone resolved (events never; with ``resolve`` False none: a
        partial look such as the last one)."""
        current = {key_of(f, self.sticky): f for f in map(self._in_attempt, findings)}
        opened, updated = [], []
        for key, finding in current.items():
            known = self._ticks.get(key)
            if known is None:
                entry = self._add(finding, "tick", now)
                self._ticks[key] = entry.id
                opened.append(entry)
            else:
                updated.append(self._seen_again(self._open[known], finding, now))
        gone = [i for k, i in self._ticks.items() if resolve and k not in current
                and self._open[i].finding.code not in self.sticky and self._settled(i, now)]
        return Changes(tuple(opened), tuple(updated), tuple(self._resolve(i, now) for i in gone))

    # ----- resolving --------------------------------------------------------------------------
    def stall_ended(self, now: float, stall_id: int) -> Changes:
        """Progress resumed: the findings of that stall no longer hold."""
        ended = [e.id for e in self._open.values() if e.trigger == "stall"
                 and e.stall_id == stall_id]
        return Changes(resolved=tuple(self._resolve(i, now) for i in ended))

    def moved_on(self, now: float, progressed_at: Mapping[int, float],
                 codes: frozenset[str]) -> Changes:
        """The job's last look: an open tick finding of ``codes`` (rules about ranks without
        progress) whose every rank progressed after it was last seen (``progressed_at``: rank ->
        the latest such moment: a phase ended, a collective, an exit 0) no longer holds, though
        no tick saw it go: a slow rank whose phase ended just before the job exited."""
        done = [e.id for e in self._open.values() if e.trigger == "tick"
                and e.finding.code in codes and e.finding.ranks
                and all(progressed_at.get(r, 0.0) > e.updated_at for r in e.finding.ranks)]
        return Changes(resolved=tuple(self._resolve(i, now) for i in done))

    def recovered(self, now: float, live: Mapping[int, int]) -> Changes:
        """Ranks the launcher started again (``live``: rank -> its present process): an open
        exit finding whose ranks each run in a process other than the one it judged (torchrun
        ``--max-restarts``, an elastic agent, a requeue) was recovered from. It is resolved,
        with the new processes in its evidence (``recovered_by``) and its summary, and, past,
        no longer critical: the same failure again in the new processes is a finding of its
        own."""
        done = []
        for entry in [e for e in self._open.values() if e.trigger == "exit"]:
            dead, ranks = entry.finding.evidence.get("pid"), entry.finding.ranks
            if dead is None or not ranks or any(live.get(r) in (None, dead) for r in ranks):
                continue
            done.append(self._recover(entry, {str(r): live[r] for r in ranks}))
            del self._exits[(entry.finding.code, entry.finding.ranks)]
        return Changes(resolved=tuple(self._resolve(e.id, now) for e in done))

    def _recover(self, entry: Entry, by: dict[str, int]) -> Entry:
        started = ", ".join(f"rank {r} as pid {pid}" for r, pid in by.items())
        severity = min(entry.finding.severity, Severity.WARNING, key=SEVERITY_LEVEL.__getitem__)
        attempt = entry.finding.evidence.get("attempt", 1)
        finding = dataclasses.replace(
            entry.finding, summary=f"{entry.finding.summary}; recovered: the launcher started "
            f"{started}" + (f" (attempt {self.attempt})" if self.attempt > attempt else ""),
            evidence={**entry.finding.evidence, "recovered_by": by, "attempt": attempt},
            severity=severity)
        return self._put(dataclasses.replace(entry, finding=finding))

    def shutdown(self, now: float, since: float) -> Changes:
        """The job exited 0: open events made only of lines libraries also print at a normal
        shutdown, first printed at ``since`` or later, were that shutdown, not a failure."""
        done = [e.id for e in self._open.values() if e.trigger == "tick"
                and printed_at_shutdown(e.finding, since)]
        return Changes(resolved=tuple(self._resolve(i, now) for i in done))

    # ----- inside -----------------------------------------------------------------------------
    def _in_attempt(self, finding: Finding) -> Finding:
        """A finding made once the launcher restarted the ranks says in which attempt (in its
        summary and as ``evidence["attempt"]``), unless it says already (an exit: the dead
        process's); a line, the attempt it was printed in; the first attempt's, as before any
        restart."""
        if self.attempt == 1 or "attempt" in finding.evidence:
            return finding
        seen = finding.evidence.get("first_at")    # a line's: when it was printed
        return in_attempt(finding, self.attempt_at(seen) if isinstance(seen, (int, float))
                          else self.attempt)

    def _add(self, finding: Finding, trigger: Trigger, now: float,
             stall_id: int | None = None) -> Entry:
        entry = Entry(self._next_id, finding, trigger, now, now, stall_id)
        self._next_id += 1
        self._opened[_code_severity(finding)] += 1
        return self._put(entry)

    def _put(self, entry: Entry) -> Entry:
        self._open[entry.id] = entry
        return entry

    def _seen_again(self, entry: Entry, finding: Finding, now: float) -> Entry:
        if entry.finding.code in self.sticky:
            finding = repeated_event(entry.finding, finding)
        return self._put(dataclasses.replace(entry, finding=finding, updated_at=now,
                                             occurrences=entry.occurrences + 1))

    def _settled(self, entry_id: int, now: float) -> bool:
        """The tick finding has not held for its rule's settling time (none: at once)."""
        entry = self._open[entry_id]
        return now - entry.updated_at >= self.settle.get(entry.finding.code, 0.0)

    def _resolve(self, entry_id: int, now: float) -> Entry:
        entry = dataclasses.replace(self._open.pop(entry_id), resolved_at=now)
        if entry.trigger == "tick":
            del self._ticks[key_of(entry.finding, self.sticky)]
        return entry


def in_attempt(finding: Finding, attempt: int) -> Finding:
    """``finding``, made in the job's ``attempt``: said first in its summary, and in its
    evidence."""
    return dataclasses.replace(finding, summary=f"attempt {attempt}: {finding.summary}",
                               evidence={**finding.evidence, "attempt": attempt})


def _code_severity(finding: Finding) -> CodeSeverity:
    return finding.code, finding.severity.value
