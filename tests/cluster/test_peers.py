"""Reading the other nodes' summaries from a shared run directory: freshness on our own clock,
lost and ended nodes, nodes never seen, and files that are not summaries."""
from __future__ import annotations

import os
from pathlib import Path

from stalldoc.cluster.publish import Publisher
from stalldoc.model.cluster import RemoteRank
from stalldoc.model.collectives import GroupState
from stalldoc.cluster.peers import PeerReader, lost_after, read_spacing

T0 = 1_000.0


def rank(n: int, label: str, verdict: str = "idle") -> RemoteRank:
    return RemoteRank(n, label, 100 + n, "train", verdict, 2.0, 2.0, False, "", "",
                      (GroupState("world", 5, 5, ()),))


def node(shared: Path, index: int) -> Publisher:
    (shared / f"node-{index}").mkdir(mode=0o700)
    return Publisher(shared / f"node-{index}", f"node-{index}", f"node {index}", "gpu-0")


def reader(shared: Path, nodes: int = 3) -> PeerReader:
    expected = tuple(f"node-{i}" for i in range(nodes))
    return PeerReader(shared, "node-0", expected, 1.0, nodes, T0)


def test_a_node_is_fresh_while_its_summary_changes_and_lost_when_it_stops(tmp_path):
    one = node(tmp_path, 1)
    one.write((rank(2, "node 1"), rank(3, "node 1")), 4, None)
    peers = reader(tmp_path)
    peers.read(T0)
    [seen] = peers.peers(T0)
    assert (seen.label, seen.lost, [r.rank for r in seen.ranks]) == ("node 1", False, [2, 3])
    peers.read(T0 + 16)                               # the same summary, 16 s later: silent
    [silent] = peers.peers(T0 + 16)
    assert silent.lost and silent.silent_for == 16
    one.again()                                       # it speaks again
    peers.read(T0 + 17)
    assert not peers.peers(T0 + 17)[0].lost
    one.write((), 4, None, ended=True)                # its job ended: silence is not loss
    peers.read(T0 + 18)
    assert not peers.peers(T0 + 100)[0].lost


def test_clocks_need_not_agree(tmp_path):
    """Only our own clock counts: a summary seen now is fresh, whatever time its host had."""
    node(tmp_path, 1).write((rank(2, "node 1"),), 3, None)
    peers = reader(tmp_path)
    peers.read(T0 + 10_000)
    assert peers.peers(T0 + 10_000)[0].silent_for == 0


def test_expected_nodes_that_never_publish_are_named_after_the_grace(tmp_path):
    node(tmp_path, 1).write((rank(1, "node 1"),), 3, None)
    peers = reader(tmp_path)
    peers.read(T0 + 10)
    assert peers.never_seen(T0 + 10) == ()            # nodes may start minutes apart
    assert peers.never_seen(T0 + 121) == ("node-2",)


def test_what_is_not_a_summary_is_skipped_with_a_reason_and_never_blocks(tmp_path):
    node(tmp_path, 1).write((rank(1, "node 1"),), 3, None)
    for name, make in (("node-2", lambda p: p.write_text("{not json")),
                       ("node-3", lambda p: os.mkfifo(p)),
                       ("node-4", lambda p: p.symlink_to(tmp_path / "node-1" / "summary.json"))):
        (tmp_path / name).mkdir()
        make(tmp_path / name / "summary.json")
    (tmp_path / "node-5").mkdir()                     # not published yet: nothing to say
    peers = reader(tmp_path, nodes=6)
    peers.read(T0)
    assert [p.name for p in peers.peers(T0)] == ["node-1"]
    assert sorted(peers.unreadable) == ["node-2", "node-3", "node-4"]


def test_reads_are_spaced_out_with_the_node_count():
    assert read_spacing(1.0, 8) == 1.0 and read_spacing(1.0, 1000) == 10.0
    assert lost_after(1.0, 8) == 15.0 and lost_after(1.0, 1000) == 50.0


def test_while_working_a_node_reads_only_its_two_neighbours_and_judges_only_them(tmp_path):
    for i in range(1, 6):
        node(tmp_path, i).write((rank(i, f"node {i}"),), 6, None)
    peers = reader(tmp_path, nodes=6)
    peers.read(T0)                                    # everyone, once
    assert peers.files_read == 5
    peers.read_neighbours(T0 + 20)                    # 20 s on: only node-1 and node-2 read
    assert peers.files_read == 7
    lost = {p.name: p.lost for p in peers.peers(T0 + 20)}
    assert lost == {"node-1": True, "node-2": True, "node-3": False, "node-4": False,
                    "node-5": False}                  # unread: unknown, never called lost
    last = PeerReader(tmp_path, "node-5", tuple(f"node-{i}" for i in range(6)), 1.0, 6, T0)
    assert last.neighbours() == ["node-0", "node-1"]  # the ring wraps
