"""SD101 from the Flight Recorder: when the agents' rings show nothing pending, the ranks' dumps
name the rank that never reached the collective the others wait in."""
from __future__ import annotations

import threading
from typing import Any

from stalldoc.analysis.flight_recorder import parse_dump
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.rules.sd101_rank_outside_collective import RankOutsideCollective


def raw(seqs: int, pending: bool) -> dict[str, Any]:
    def entry(seq: int, retired: bool) -> dict[str, Any]:
        return {"process_group": ("0", "default_pg"), "pg_id": 0, "collective_seq_id": seq,
                "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "gloo:all_reduce",
                "state": "scheduled", "retired": retired, "input_sizes": [[18]],
                "input_dtypes": ["Float"],
                "frames": [{"name": "backward", "filename": "/x/site-packages/torch/_tensor.py",
                            "line": 623}, {"name": "train", "filename": "/job/train.py",
                                           "line": 26}]}
    entries = [entry(n, True) for n in range(1, seqs + 1)]
    if pending:
        entries.append(entry(seqs + 1, False))
    return {"pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "entries": entries}


def stacks(rank: int, *files: str) -> RankStacks:
    frames = tuple(Frame(f"f{n}", name, n) for n, name in enumerate(files))
    return RankStacks(rank, 100 + rank, 0.0, "py-spy", (ThreadStack(100 + rank, "main", True,
                                                                    False, frames),))


def window(dumps: dict[int, Any], rank_stacks: dict[int, RankStacks]) -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in range(3))
    flight = {r: parse_dump(r, f"/run/flight/rank_{r}", d) for r, d in dumps.items()}
    return Window(0.0, ranks, stacks=rank_stacks, flight=flight)


def test_the_rank_behind_is_named_with_the_collectives_frame():
    w = window({0: raw(7, True), 1: raw(7, True), 2: raw(7, False)},
               {2: stacks(2, threading.__file__, "/job/data.py")})
    [finding] = RankOutsideCollective().check(w)
    assert finding.ranks == (2,)
    ev = finding.evidence
    assert (ev["source"], ev["seq"], ev["op"], ev["waiting_ranks"]) == ("flight_recorder", 8,
                                                                          "all_reduce", [0, 1])
    assert ev["collective_frame"] == "train (/job/train.py:26)"
    assert ev["frame"] == "f1 (/job/data.py:1)"
    assert "from the Flight Recorder" in finding.summary


def test_a_rank_without_a_dump_is_blamed_only_when_its_stack_is_outside_torch_distributed():
    dumps = {0: raw(7, True), 1: raw(7, True)}
    inside = stacks(2, "/x/torch/distributed/distributed_c10d.py", "/job/train.py")
    assert list(RankOutsideCollective().check(window(dumps, {2: inside}))) == []
    [finding] = RankOutsideCollective().check(window(dumps, {2: stacks(2, "/job/data.py")}))
    assert finding.ranks == (2,) and finding.evidence["no_dump_ranks"] == [2]
    assert "sent no Flight Recorder dump" in finding.summary
