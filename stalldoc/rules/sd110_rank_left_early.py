"""SD110 rank-left-early."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.rings import left_early, wrapped_evidence
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankExit
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, phase_of


def how_it_ended(exit: RankExit) -> str:
    if exit.signal:
        return f"was killed by signal {exit.signal}"
    if exit.exit_code is None:
        return "ended (exit status not seen)"
    return f"exited with status {exit.exit_code}"


class RankLeftEarly(Rule):
    """The live ranks wait in a collective that a rank which has already ended never reached.

    What it does
        At a stall, aligns the collective rings of the live ranks with those of the ranks that
        ended: when every live rank of a group waits in collective N and a rank of that group
        ended before entering it, that rank is named with how and when it ended, even when it
        exited 0 (a rank that ran out of data).

    Why is this bad?
        A collective needs every rank of its group. Under NCCL the survivors wait until the
        collective timeout (30 min by default, about 208 days under swift); under gloo they wait
        as long as the peer's sockets stay open (a forked worker of the dead rank can hold
        them). The launcher keeps waiting too, since no rank failed.

    Evidence
        the rank, its pid, exit status or signal and where it was read (``source``: proc, relay,
        launcher-log, agent; unknown when the launcher reaped the rank first), seconds between its
        end and the stall, its last phase and last collective; the group, op and sequence number
        the others wait in; ``wrapped_collectives``: per rank, the collectives of the group its
        agent's ring overwrote before the watcher read them (only when some were).

    Fix
        Make every rank run the same number of steps (even data shards: DistributedSampler with
        drop_last, or ``torch.distributed.algorithms.Join`` for uneven inputs), and make an early
        return or exception on one rank end the whole job (``destroy_process_group`` /
        ``sys.exit(1)``) instead of leaving the others in the next collective.

    References
        PyTorch "Distributed training with uneven inputs using the Join context manager";
        torch Flight Recorder "Not all ranks joining collective N".
    """

    code = "SD110"
    name = "rank-left-early"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        ended = {e.rank: e for e in window.exits}
        live = {r.rank for r in window.ranks} - set(ended)
        for gap in left_early(window.agents, live, set(ended)):
            gone = [ended[r] for r in gap.missing]
            waiting = sorted(gap.waiting)
            parts = [f"rank {e.rank} (pid {e.pid}) {how_it_ended(e)} "
                     f"{window.now - e.t:.0f} s ago" for e in gone]
            summary = (f"{join_ranks(waiting)} wait in {gap.op} #{gap.seq} (group {gap.group}) "
                       f"that {join_ranks(gap.missing)} never reached: {'; '.join(parts)}")
            first = gone[0]
            yield self.finding(gap.missing, summary, {
                "frames": [], "frame": "", "phase": phase_of(window, first.rank),
                "group": gap.group, "seq": gap.seq, "op": gap.op, "waiting_ranks": waiting,
                "exits": {str(e.rank): {"pid": e.pid, "exit_code": e.exit_code,
                                        "signal": e.signal, "source": e.source,
                                        "seconds_before": round(
                                            window.now - e.t, 1)} for e in gone},
                **wrapped_evidence(gap.wrapped)})
