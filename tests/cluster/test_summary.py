"""The node summary: what one node's watcher publishes is what the others read, and anything
else in its place (another host's garbage, a truncated write, a huge file) is refused whole."""
from __future__ import annotations

import json

import pytest

from stalldoc.cluster.summary import MAX_BYTES, BadSummary, Published, decode, encode
from stalldoc.model.cluster import RemoteRank
from stalldoc.model.collectives import CollectiveRecord, GroupState

PENDING = CollectiveRecord("world", 42, "all_reduce", 4096, "bfloat16", 10.0, None, False)
DONE = CollectiveRecord("1", 7, "broadcast", 1, "int64", 9.0, 9.5, False)


def summary(**changes) -> Published:
    ranks = (RemoteRank(11, "node 1", 4242, "rollout", "idle", 61.5, 62.0, False,
                        "load_shard (/data/train.py:88)", "waiting: file", (
                            GroupState("world", 42, 41, (PENDING,)), GroupState("1", 7, 7, (DONE,)))),
             RemoteRank(12, "node 1", 4243, "", "work", 0.4, 0.5, True, "", "", ()))
    fields = dict(node="node-1", label="node 1", host="gpu-07", seq=17, state="running",
                  world_size=16, stall_id=2, stall_stacks=True, ranks=ranks)
    return Published(**{**fields, **changes})


def test_a_summary_reads_back_as_written_with_only_the_pending_collective():
    back = decode(encode(summary()))
    assert back.ranks[0].groups[0].ring == (
        CollectiveRecord("world", 42, "all_reduce", 4096, "bfloat16", 0.0, None, False),)
    assert back.ranks[0].groups[1] == GroupState("1", 7, 7, ())      # nothing pending there
    assert back.ranks[1] == summary().ranks[1]
    assert (back.node, back.label, back.host, back.seq, back.world_size, back.stall_id,
            back.stall_stacks) == ("node-1", "node 1", "gpu-07", 17, 16, 2, True)
    assert decode(encode(summary(stall_id=None))).stall_id is None


def test_eight_ranks_fit_in_a_few_kilobytes():
    many = summary(ranks=summary().ranks[:1] * 8)
    assert len(encode(many)) < 4096


@pytest.mark.parametrize("damage", [
    lambda d: d.update(format=2),
    lambda d: d.update(seq=-1),
    lambda d: d.update(seq=True),
    lambda d: d.update(state="sleeping"),
    lambda d: d["ranks"][0].update(verdict="busy"),
    lambda d: d["ranks"][0].update(work_age=float("nan")),
    lambda d: d["ranks"][0].update(work_age=-3),
    lambda d: d["ranks"][0].update(groups="world"),
    lambda d: d["ranks"][0]["groups"][0]["pending"].update(seq="42"),
    lambda d: d.update(ranks={"11": {}}),
    lambda d: d.update(stall=[2]),
])
def test_a_damaged_summary_is_refused_whole(damage):
    doc = json.loads(encode(summary()))
    damage(doc)
    with pytest.raises(BadSummary):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"[]", b"null",
                                  encode(summary())[:-10], b" " * (MAX_BYTES + 1)])
def test_what_is_not_a_summary_is_refused(data):
    with pytest.raises(BadSummary):
        decode(data)


def test_long_text_from_another_host_is_cut():
    doc = json.loads(encode(summary()))
    doc["ranks"][0]["frame"] = "x" * 10_000
    assert len(decode(json.dumps(doc).encode()).ranks[0].frame) == 300
