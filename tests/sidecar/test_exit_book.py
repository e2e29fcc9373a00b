"""The watcher's book of ended ranks across an elastic restart: torchrun's agent starts the new
ranks within a second or two of the old ones' deaths, before those deaths have settled and been
recorded (EXIT_SETTLE_SECONDS). The pids are those of a real run (torch 2.13,
``--max-restarts 1``, rank 1 failing while it loads its checkpoint shard)."""
from __future__ import annotations

from pathlib import Path

from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.sidecar.exits import EXIT_SETTLE_SECONDS, ExitBook
from stalldoc.store.db import RunStore

ARGV = ("python", "-u", "train.py")


def rank(number: int, pid: int) -> RankProcess:
    return RankProcess(number, pid, number, ARGV)


def book_after_a_fast_restart(tmp_path: Path) -> tuple[ExitBook, dict[int, RankProcess]]:
    """The first attempt's two deaths, seen at 0.0 s, recorded once settled, by which time the
    second attempt's processes hold ranks 0 and 1."""
    book = ExitBook(RunStore(tmp_path))
    first, second = {0: rank(0, 29126), 1: rank(1, 29127)}, {0: rank(0, 29183), 1: rank(1, 29184)}
    for r in first.values():
        book.store.add_rank(r, 0.0)
    book.pending = [RankExit(1, 29127, 0.0, 1, None, "proc"),
                    RankExit(0, 29126, 0.2, 143, 15, "proc")]
    for number, process in second.items():   # the watcher's discovery of the new processes
        book.forget(number)
        book.store.add_rank(process, 0.5)
    book.settle(EXIT_SETTLE_SECONDS + 0.3, False, None, (), lambda exit: exit)
    return book, second


def test_the_restarted_processes_are_not_taken_for_ended(tmp_path: Path):
    book, present = book_after_a_fast_restart(tmp_path)
    try:
        # THEN the old exits are on record, as the first attempt's, and the new ranks live on
        assert {r: e.pid for r, e in book.by_rank.items()} == {0: 29126, 1: 29127}
        assert [book.ended(process) for process in present.values()] == [False, False]
        assert book.ended(rank(1, 29127))
        # AND the exit rules read the first failure; a stall of the new ranks reads no exit
        assert sorted(e.pid for e in book.for_rules()) == [29126, 29127]
        assert book.for_rules(present) == ()
    finally:
        book.close()
        book.store.close()


def test_a_present_process_that_ended_is_read_by_every_rule(tmp_path: Path):
    book, present = book_after_a_fast_restart(tmp_path)
    try:
        book.record(RankExit(1, 29184, 9.0, 1, None, "proc"))
        assert book.ended(present[1]) and not book.ended(present[0])
        assert [e.pid for e in book.for_rules(present)] == [29184]
    finally:
        book.close()
        book.store.close()
