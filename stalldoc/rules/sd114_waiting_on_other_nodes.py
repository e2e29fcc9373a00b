"""SD114 waiting-on-other-nodes."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, rank_evidence


class WaitingOnOtherNodes(Rule):
    """This node's ranks wait in a collective for ranks of other nodes that this watcher
    cannot see.

    What it does
        In a multi-node job, compares the world size the ranks report with the ranks this
        watcher can see: its own, and those the other nodes' watchers publish in a shared run
        directory. When this node's live ranks all sit in a collective of the world group, the
        ranks they wait for are the global ranks seen nowhere (no shared run directory, or their
        node's watcher never published): named, with the collective and the first waiting
        rank's frame.

    Why is this bad?
        Nothing on this node is at fault, and nothing here can say which remote rank is: the
        collective completes only when the other nodes' ranks join it. Looking for the cause on
        this node wastes the hours the job sits idle.

    Evidence
        group, seq and op of the collective; this node's waiting ranks; the world size; the
        global ranks on other nodes; the first waiting rank's frames.

    Fix
        Look at the named ranks on the other nodes: run ``stalldoc attach <launcher pid>`` on
        each of them. Next time give every node's ``stalldoc watch`` the same ``--run-dir`` on a
        shared filesystem, so every node names the culprit rank, its node and its frame.

    References
        docs/multi-node.md.
    """

    code = "SD114"
    name = "waiting-on-other-nodes"
    severity = Severity.WARNING

    def check(self, window: Window) -> Iterator[Finding]:
        cluster = window.cluster
        if cluster is None or not cluster.world_size:
            return
        live = {r.rank for r in window.ranks} - {e.rank for e in window.exits}
        pending = {r: a.pending for r, a in window.agents.items() if r in live}
        world = {r: next((p for p in calls if p.group == "world"), None)
                 for r, calls in pending.items()}
        if not live or any(world.get(r) is None for r in live):
            return
        first = min((rec for rec in world.values() if rec is not None), key=lambda c: c.seq)
        seen = {r.rank for r in window.ranks} | set(cluster.remote())
        others = sorted(set(range(cluster.world_size)) - seen)
        if not others:
            return
        waiting = sorted(live)
        why = ("no node's watcher with them published in the shared run directory"
               if cluster.shared else "without a run directory shared by the nodes' watchers")
        summary = (f"{join_ranks(waiting)} ({cluster.node}) wait in {first.op} #{first.seq} "
                   f"(group world) for {join_ranks(others)} on other nodes (world size "
                   f"{cluster.world_size}); {why}, which of them is missing cannot be seen "
                   f"from here")
        yield self.finding(waiting, summary, {
            **rank_evidence(window, waiting[0]), "group": "world", "seq": first.seq,
            "op": first.op, "waiting_ranks": waiting, "world_size": cluster.world_size,
            "other_ranks": others, "node": cluster.node})
