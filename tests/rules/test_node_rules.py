"""Good / bad windows for the rules across nodes: SD101 with the culprit on another node,
SD113 node-lost, SD114 waiting-on-other-nodes. The figures are those of the real runs in
tests/cluster/test_multinode.py (2 nodes x 2 ranks; rank 3 hangs opening a shard)."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.model.cluster import ClusterView, PeerNode, RemoteRank
from stalldoc.model.findings import Severity
from stalldoc.model.ranks import RankProcess
from stalldoc.model.window import Window
from stalldoc.rules import by_code

NOW = 1000.0
FRAME = "load_shard (/jobs/multinode_shards.py:22)"


def in_all_reduce(rank: int, seq: int = 4) -> tuple[GroupState, ...]:
    record = CollectiveRecord("world", seq, "all_reduce", 256, "float32", NOW - 5, None, False)
    return (GroupState("world", seq, seq - 1, (record,)),)


def before_all_reduce(seq: int = 4) -> tuple[GroupState, ...]:
    done = CollectiveRecord("world", seq - 1, "all_reduce", 256, "float32", NOW - 6, NOW - 6, False)
    return (GroupState("world", seq - 1, seq - 1, (done,)),)


def agent(rank: int, groups: tuple[GroupState, ...], world: int = 4) -> AgentSnapshot:
    return AgentSnapshot(100 + rank, rank, rank % 2, world, 0, 0.0, NOW, 3, NOW, None, (), "", 0,
                         (), groups)


def node_one(lost: bool = False, state: str = "running") -> PeerNode:
    return PeerNode("node-1", "node 1", "gpu-02", state, 40.0 if lost else 0.5, lost,
                    41.0 if lost else 1.0, 1, True, (
        RemoteRank(2, "node 1", 202, "", "idle", 5.0, 5.0, False,
                   "train_step (/jobs/multinode_shards.py:29)", "waiting: collective",
                   in_all_reduce(2)),
        RemoteRank(3, "node 1", 203, "", "idle", 5.0, 5.2, False, FRAME, "waiting: file",
                   before_all_reduce())))


def window(cluster: ClusterView | None, **agents_of: tuple[GroupState, ...]) -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in (0, 1))
    agents = {r: agent(r, agents_of.get(f"r{r}", in_all_reduce(r))) for r in (0, 1)}
    return Window(NOW, ranks, agents, cluster=cluster)


def shared(*peers: PeerNode, never: tuple[str, ...] = ()) -> ClusterView:
    return ClusterView("node 0", True, 2, 4, peers, never, 15.0)


def test_sd101_bad_the_culprit_is_a_rank_of_another_node_with_its_frame():
    [finding] = by_code("SD101")().check(window(shared(node_one())))
    assert finding.ranks == (3,)
    assert finding.summary == (f"rank 3 (node 1) not in all_reduce #4 (group world) that ranks "
                               f"0-2 wait in; rank 3 is in {FRAME}, for 5 s")
    assert finding.evidence["nodes"] == {"0": "node 0", "1": "node 0", "2": "node 1",
                                         "3": "node 1"}
    assert finding.evidence["culprits"]["3"]["stack_method"] == "node summary"


def test_sd101_good_every_rank_of_every_node_waits_in_the_collective():
    peer = node_one()
    waiting = PeerNode(**{**peer.__dict__, "ranks": tuple(
        RemoteRank(**{**r.__dict__, "groups": in_all_reduce(r.rank)}) for r in peer.ranks)})
    assert list(by_code("SD101")().check(window(shared(waiting)))) == []


def test_sd101_a_local_culprit_is_tagged_with_this_node():
    [finding] = by_code("SD101")().check(window(shared(node_one()), r1=before_all_reduce()))
    assert finding.ranks == (1, 3)
    assert finding.summary.startswith("ranks 1,3 not in all_reduce #4 (group world) that "
                                      "ranks 0,2 wait in; rank 1 (node 0) is at an unknown "
                                      "frame")
    assert f"rank 3 (node 1) is in {FRAME}" in finding.summary


def test_sd113_bad_a_silent_node_is_lost_with_what_its_ranks_did():
    [finding] = by_code("SD113")().check(window(shared(node_one(lost=True))))
    assert finding.ranks == (2, 3) and finding.severity is Severity.ERROR
    assert finding.summary.startswith("node 1 (gpu-02, ranks 2,3) published nothing for 40 s")
    assert f"rank 3: idle in {FRAME}" in finding.summary
    assert finding.evidence["ranks"]["3"]["pid"] == 203


def test_sd113_bad_a_node_never_seen():
    [finding] = by_code("SD113")().check(window(shared(node_one(), never=("node-2",))))
    assert finding.summary.startswith("node-2 published no summary")


def test_sd113_good_a_speaking_node_an_ended_one_and_no_shared_dir():
    rule = by_code("SD113")()
    assert list(rule.check(window(shared(node_one())))) == []
    assert list(rule.check(window(shared(node_one(lost=True, state="ended"))))) == []
    assert list(rule.check(window(None))) == []


def test_sd114_bad_without_a_shared_dir_the_awaited_ranks_are_named():
    alone = ClusterView("node 0", False, 2, 4)
    [finding] = by_code("SD114")().check(window(alone))
    assert finding.ranks == (0, 1) and finding.evidence["other_ranks"] == [2, 3]
    assert finding.summary.startswith("ranks 0,1 (node 0) wait in all_reduce #4 (group world) "
                                      "for ranks 2,3 on other nodes (world size 4); without")


def test_sd114_good_when_a_local_rank_is_elsewhere_or_every_rank_is_seen():
    alone = ClusterView("node 0", False, 2, 4)
    assert list(by_code("SD114")().check(window(alone, r1=before_all_reduce()))) == []
    assert list(by_code("SD114")().check(window(shared(node_one())))) == []
    assert list(by_code("SD114")().check(window(ClusterView("node 0", False, 1, 2)))) == []
