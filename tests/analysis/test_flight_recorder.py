"""Reading Flight Recorder dumps without torch, and aligning them per process group.

The raw dumps here are built like torch 2.13's ``_dump_fr_trace()`` (the keys and value types
of a real gloo dump); the end-to-end test (tests/test_watch_flight.py) reads real ones."""
from __future__ import annotations

import os
import pickle
from typing import Any

import pytest

from stalldoc.analysis.flight_recorder import (UnsafeDump, flight_gaps, flight_mismatches,
                                               loads_plain, read_dump, read_dumps)


def entry(seq: int, op: str = "all_reduce", retired: bool = True, group: tuple[str, str] =
          ("0", "default_pg"), sizes: list[list[int]] | None = None, p2p: bool = False
          ) -> dict[str, Any]:
    return {"frames": [{"name": "backward", "filename": "/site-packages/torch/_tensor.py",
                        "line": 623},
                       {"name": "train_step", "filename": "/job/train.py", "line": 42}],
            "record_id": seq - 1, "pg_id": int(group[0]), "process_group": group,
            "thread_name": "python", "thread_id": "1", "collective_seq_id": 0 if p2p else seq,
            "p2p_seq_id": seq if p2p else 0, "op_id": seq, "profiling_name": f"gloo:{op}",
            "time_created_ns": 1, "input_sizes": sizes or [[20]], "input_dtypes": ["Float"],
            "output_sizes": sizes or [[20]], "output_dtypes": ["Float"], "state": "scheduled",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": retired, "timeout_ms": 1800000, "is_p2p": p2p}


def dump(entries: list[dict[str, Any]], ranks: str = "[0, 1, 2]",
         status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"version": "2.10", "comm_lib_version": "",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "pg_status": status or {}, "entries": entries}


def write(directory: Any, rank: int, raw: dict[str, Any]) -> None:
    (directory / f"rank_{rank}").write_bytes(pickle.dumps(raw))


def test_a_pickle_naming_a_callable_is_refused_not_run(tmp_path):
    # GIVEN a "dump" that would run os.system when unpickled by a plain pickle.load
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    # WHEN the watcher reads it THEN it is refused and nothing ran
    with pytest.raises(UnsafeDump, match="refused global"):
        read_dump(tmp_path / "rank_0")
    assert not (tmp_path / "pwned").exists()
    dumps, skipped = read_dumps(tmp_path)
    assert dumps == {} and "refused global" in skipped["rank_0"]


def test_plain_types_come_back_as_they_were():
    raw = dump([entry(1)])
    assert loads_plain(pickle.dumps(raw)) == raw


def test_rank_that_never_reached_the_pending_collective_is_missing(tmp_path):
    # GIVEN ranks 0 and 1 waiting in all_reduce #8 (not retired) and rank 2 done with #7 only
    done = [entry(n) for n in range(1, 8)]
    write(tmp_path, 0, dump(done + [entry(8, retired=False)]))
    write(tmp_path, 1, dump(done + [entry(8, retired=False)]))
    write(tmp_path, 2, dump(done))
    dumps, skipped = read_dumps(tmp_path)
    # WHEN aligned THEN rank 2 is missing from #8 of group 0, which 0 and 1 wait in
    [gap] = flight_gaps(dumps, {0, 1, 2})
    assert skipped == {}
    assert (gap.group, gap.group_desc, gap.seq, gap.op) == ("0", "default_pg", 8, "all_reduce")
    assert sorted(gap.waiting) == [0, 1] and gap.missing == (2,) and gap.silent == ()
    assert str(gap.waiting[0].frames[1]) == "train_step (/job/train.py:42)"


def test_a_collective_torch_saw_complete_is_not_pending_before_it_retires(tmp_path):
    # GIVEN the last entry not yet retired but pg_status saying it completed (gloo retires late)
    status = {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                    "last_completed_collective": 3}}
    write(tmp_path, 0, dump([entry(1), entry(2), entry(3, retired=False)], status=status))
    write(tmp_path, 1, dump([entry(1), entry(2)]))
    dumps, _ = read_dumps(tmp_path)
    assert flight_gaps(dumps, {0, 1}) == []


def test_live_members_without_a_dump_are_silent_and_dead_ones_ignored(tmp_path):
    write(tmp_path, 0, dump([entry(1), entry(2, retired=False)]))
    dumps, _ = read_dumps(tmp_path)
    [gap] = flight_gaps(dumps, {0, 1})
    assert gap.missing == () and gap.silent == (1,)
    assert flight_gaps(dumps, {0}) == []   # 1 and 2 ended: nobody to blame here


def test_new_groups_align_on_their_own_members(tmp_path):
    # GIVEN a group "1" of ranks 1,2 (named in pg_config): rank 1 waits in #3, rank 2 is at #2
    sub = ("1", "tp")
    for rank, last in ((0, None), (1, 3), (2, 2)):
        entries = [entry(1)] + ([entry(n, group=sub) for n in range(1, 3)] if last else [])
        if last == 3:
            entries.append(entry(3, "all_gather", retired=False, group=sub))
        raw = dump(entries)
        raw["pg_config"]["1"] = {"name": "1", "desc": "tp", "ranks": "[1, 2]"}
        write(tmp_path, rank, raw)
    dumps, _ = read_dumps(tmp_path)
    [gap] = flight_gaps(dumps, {0, 1, 2})
    assert (gap.group, gap.seq, gap.op, gap.missing) == ("1", 3, "all_gather", (2,))


def test_p2p_entries_are_not_aligned(tmp_path):
    write(tmp_path, 0, dump([entry(1, "send", retired=False, p2p=True)]))
    write(tmp_path, 1, dump([]))
    dumps, _ = read_dumps(tmp_path)
    assert flight_gaps(dumps, {0, 1}) == []


def test_first_op_or_size_mismatch_per_group(tmp_path):
    write(tmp_path, 0, dump([entry(1), entry(2, sizes=[[20]]), entry(3)]))
    write(tmp_path, 1, dump([entry(1), entry(2, "all_gather", sizes=[[10]]), entry(3, "x")]))
    dumps, _ = read_dumps(tmp_path)
    [mismatch] = flight_mismatches(dumps)
    assert (mismatch.group, mismatch.seq) == ("0", 2)
    assert mismatch.calls == {0: ("all_reduce", ((20,),), ("Float",)),
                              1: ("all_gather", ((10,),), ("Float",))}


def test_garbage_and_stray_files_are_skipped(tmp_path):
    (tmp_path / "rank_0").write_bytes(b"not a pickle")
    (tmp_path / "rank_1").write_bytes(pickle.dumps(["no", "entries"]))
    (tmp_path / ".partial-123").write_bytes(b"half")
    write(tmp_path, 2, dump([{"collective_seq_id": "x"}, 7, entry(1)]))
    dumps, skipped = read_dumps(tmp_path)
    assert list(dumps) == [2] and len(dumps[2].entries) == 1
    assert sorted(skipped) == ["rank_0", "rank_1"]


def test_gloo_groups_listed_under_no_name_fall_back_to_the_world(tmp_path):
    # torch 2.13 gloo lists the default group under '' (the agent repairs it; an old dump may not)
    for rank in (0, 1):
        raw = dump([entry(1), entry(2, retired=rank == 1)] if rank == 0 else [entry(1)])
        raw["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
        write(tmp_path, rank, raw)
    dumps, _ = read_dumps(tmp_path)
    assert dumps[0].groups == {}
    [gap] = flight_gaps(dumps, {0, 1})
    assert gap.missing == (1,)
