"""SD101 rank-outside-collective."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.causes import Cause, crossed_cause, issued_at
from stalldoc.analysis.flight_recorder import FlightGap, flight_gaps
from stalldoc.analysis.rings import (MissingFromCollective, crossed, groups_by_rank,
                                     missing_ranks, wrapped_evidence)
from stalldoc.analysis.stacks import in_collective
from stalldoc.analysis.train_barrier import KIND as BARRIER_SKIPPED
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, cause_of, describe, join_ranks, rank_evidence
from stalldoc.rules.remote import describe_rank, evidence_of, node_tag, remote_ranks


class RankOutsideCollective(Rule):
    """Some ranks wait in a collective that other ranks never entered.

    What it does
        Aligns the collective rings of all ranks by process group and sequence number. When some
        ranks sit in collective N and others have not reached it, the others are the culprits;
        their own Python frame says where they are instead. When the agent's rings show nothing
        pending (the hang is in a collective the agent does not wrap: DDP's reducer, c10d
        internals, functional collectives, DTensor), the ranks' PyTorch Flight Recorder dumps,
        taken on the stall, are aligned the same way. Without the agent, ranks whose main thread
        is inside torch.distributed are compared with those that are not.

    Why is this bad?
        A collective completes only when every rank of the group joins it. The waiting ranks hold
        their GPU memory and spin or sleep until the NCCL/gloo timeout (30 min by default, ~208
        days under swift), with nothing in the log.

    Evidence
        group, seq, op of the collective; the waiting ranks; each culprit's frames (innermost
        first), its user frame, phase, and seconds without progress; ``kernel_wait``, for a
        culprit whose stack does no work while its main thread is blocked in the kernel on a
        file, a pipe, a device or a socket (``call``, ``target``: the path or "TCP to
        host:port", ``wchan``, ``state``, ``words``: "blocked in openat(/mnt/ckpt/step_2.pt)
        (kernel: wait_for_partner)", which the summary adds); ``source`` ("agent",
        "flight_recorder" or "stacks"); from the Flight Recorder also the missing ranks, the
        waiting ranks' Python frames of the collective (when the dumps hold frames; else the
        first waiting rank's user frame from its stack) and ranks that sent no dump; from the
        agent, ``wrapped_collectives``: per rank, the collectives of the group its agent's ring
        overwrote before the watcher read them (only when some were). ``cause``, only where the
        Flight Recorder decides one: a culprit that waits in another collective at the sequence
        number a waiting rank waits at (``kind`` "uneven_steps" when DDP issued the culprit's
        from ``backward()``: the ranks ran different numbers of steps, with
        ``backward_collectives`` per side where both dumps hold the whole history;
        "skipped_step" when, besides, the job's latest output shows a batch skipped after an
        error, quoted in
        ``log_line``: one rank skipped a step alone; "forward_on_some_ranks" when one side
        gathers sharded parameters (FSDP, ZeRO-3) for a forward on a path the other never ran,
        with ``forward_rank``, ``forward_frames`` and ``sharding``; "forward_count_differs"
        when the other ran that forward too, fewer times; "size_mismatch" when both sides are
        in one collective from one line with different sizes (``input_sizes``,
        ``object_collective``); "some_ranks_only" when
        one side's was issued from a line the other rank never issued one from, with
        ``branch_rank`` and ``branch_frames``; "collective_order" when each side's line is in
        the other's history; else "different_collectives"), with ``says``,
        ``group``, ``seq``, each side's ``ops`` and ``frames``; the summary adds ``says`` and
        the fix is the cause's own. Decided from the stacks instead (vLLM's shared-memory
        collectives pass no torch.distributed call the rings or the dumps see):
        "engine_collective", a culprit whose main thread waits in its colocated vLLM engine's
        tensor-parallel collective (``external_launcher``: TRL's and swift's colocate mode)
        while the waiting ranks of its TP group wait outside their engine: each side waits for
        the other, with ``engine_rank``, ``engine_frame``, ``user_frame``, ``outside_engine``
        (only the ranks of its TP group, by the ``tp_size`` its agent recorded; every waiting
        rank when that is unknown), ``engine_group`` ("tensor-parallel") and ``engine``; the same
        with ``engine_group`` "data-parallel" for a culprit that waits in its engine's
        data-parallel sync (vLLM's ``has_unfinished_dp``, ``coordinate_batch_across_dp``; SGLang's
        DP-attention batch exchange), a collective on the engine's DP group, while the waiting
        ranks of that group are outside their engine: the replicas are out of step. The waiting
        ranks' own collective is then no second finding. Ranks that wait for each other in
        two groups' collectives (those missing from one group's all wait in the other's, which
        its waiting ranks never entered) are one finding naming every rank of both sides, with
        ``crossed`` (the other group's collective: group, seq, op, waiting and missing ranks)
        and ``cause`` "crossed_groups", unless a side waits in its rollout engine's own
        collective (the engine cause says more). "train_barrier_skipped", decided from the
        stacks (Ray Train's barriers are calls to its synchronization actor, in no ring and no
        dump): every culprit waits in ``ray.train.report`` (with a checkpoint),
        ``ray.train.collective.barrier`` or ``broadcast_from_rank_zero``, a barrier of every Ray
        Train worker, and no waiting rank does: the waiting ranks went past it without the call,
        each side waits for the other, and the finding names the waiting ranks (as Ray Train's
        own warning does; their frame is ``frame``), with ``call``, ``barrier_ranks``,
        ``skipped_ranks`` and ``barrier_frame``. ``waits_on_child``, for a culprit whose
        main thread waits on its own processes (DataLoader workers, a pool, a child, a subprocess):
        the first such child whose stack, taken on the stall, is in code outside libraries
        (``pid``, ``what``, ``frame``, ``frames``, ``waits_on_lock``); the summary says where
        that child is.

    Fix
        Look at the culprit's frame and find out why it is there instead of in the collective: a
        data loader, reward function, rollout server call, file system access or checkpoint save
        that blocks on one rank only. Make the work before the collective the same on every rank, or
        give the blocking call a timeout.

        Code that runs only on rank 0 must not be followed by a collective the others enter early.

        Uneven inputs (the culprit waits in DDP's gradient all-reduce from ``backward()`` while
        the others wait in the collective after their loop): give every rank the same number of
        batches (``DistributedSampler(drop_last=True)``, ``--dataloader_drop_last true``), or use
        ``model.join()`` / ``torch.distributed.algorithms.Join``.

        Ranks that wait for each other in two groups' collectives (crossed_groups): every rank
        must issue the collectives of every group in the same order; compare the two frames
        named and find the branch or the order that differs.

        Ray Train (train_barrier_skipped): call ``ray.train.report`` on every worker as often as
        the others, with ``checkpoint=None`` where a rank saves none, rather than under a branch
        on the rank; the same for ``ray.train.collective.barrier``.

        A colocated vLLM engine with tensor_parallel_size > 1 (engine_collective): every rank of
        a TP group must call generate the same number of times, with the same prompts; gather
        the group's prompts first and let a rank with none of its own still join the call. Its
        data-parallel replicas (data_parallel_size > 1) likewise: every DP rank calls generate
        as often as the others, also with no prompts of its own.

    References
        torch Flight Recorder's analyzer (``torchfrtrace``: "Not all ranks joining collective N"); PyTorch's
        "Distributed Training with Uneven Inputs Using the Join Context Manager";
        pytorch/pytorch#38174; Lightning-AI/pytorch-lightning#20404; huggingface/trl#3671
        (GRPO with vLLM colocated hangs at llm.generate); huggingface/trl#3394 (colocation via
        vLLM's external launcher, TP groups of consecutive ranks); vllm-project/vllm#28224 (a
        DP replica out of requests runs dummy batches, gets out of step with the others and
        hangs in the all-reduce of ``coordinate_batch_across_dp``); verl-project/verl#5607
        (a vLLM rollout with DP > 1 hangs the main process for dense models: verl gave vLLM its
        data-parallel settings only with expert parallelism, so its DP engines never started);
        ray-project/ray#38958 and #33360 (reports and checkpoints from some workers only) and
        Ray Train's ``report`` docstring ("All workers must call `ray.train.report` the same
        number of times [...] Otherwise, your training will hang").
    """

    code = "SD101"
    name = "rank-outside-collective"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        live = {r.rank for r in window.ranks} - {e.rank for e in window.exits}
        remote = remote_ranks(window)
        gaps = missing_ranks({**groups_by_rank(window.agents),
                              **{r: rr.groups for r, rr in remote.items()}}, live | set(remote))
        flight = [g for g in ([] if gaps else flight_gaps(window.flight, live))
                  if g.missing or self._outside(window, g.silent)]
        pairs = [pair for pair in crossed(gaps) if not _in_engine(window, pair)]
        paired = [id(g) for pair in pairs for g in pair]
        yield from _one_per_engine_wait([self._crossing(window, *pair) for pair in pairs]
                                        + [self._from_rings(window, gap) for gap in gaps
                                           if id(gap) not in paired]
                                        + [self._from_flight(window, g) for g in flight])
        if not gaps and not flight and not window.agents:
            yield from self._from_stacks(window, live)

    def _from_rings(self, window: Window, gap: MissingFromCollective) -> Finding:
        """Ranks missing from a collective the others wait in, here or on other nodes."""
        waiting = sorted(gap.waiting)
        cause = cause_of(window, gap.missing, waiting)
        named = _named(cause, list(gap.missing))
        one = len(gap.missing) == 1
        culprits = ", ".join(f"rank {r}{'' if one else node_tag(window, r)} is "
                             f"{describe_rank(window, r)}" for r in gap.missing)
        missing = join_ranks(gap.missing) + (node_tag(window, gap.missing[0]) if one else "")
        summary = (f"{missing} not in {gap.op} #{gap.seq} (group {gap.group}) that "
                   f"{join_ranks(waiting)} {_wait(waiting)} in; {culprits}")
        evidence = {**evidence_of(window, named[0]), "source": "agent",
                    "group": gap.group, "seq": gap.seq, "op": gap.op, "waiting_ranks": waiting,
                    "waiting_at": {str(r): {"seq": rec.seq, "op": rec.op}
                                   for r, rec in sorted(gap.waiting.items())},
                    "culprits": {str(r): evidence_of(window, r) for r in gap.missing},
                    **wrapped_evidence(gap.wrapped)}
        if window.cluster is not None:
            evidence["nodes"] = {str(r): node_tag(window, r)[2:-1]
                                 for r in sorted({*gap.missing, *waiting})}
        return self.caused(named, summary, evidence, cause)

    def _crossing(self, window: Window, one: MissingFromCollective,
                  other: MissingFromCollective) -> Finding:
        """Ranks that wait for each other in collectives of two groups: one finding that names
        every rank of both sides (neither side alone is the culprit)."""
        one, other = sorted((one, other), key=lambda g: (g.group != "world", g.group))
        ranks = sorted(set(one.missing) | set(other.missing))
        sides = "; ".join(f"{join_ranks(sorted(g.waiting))} {_wait(sorted(g.waiting))} in "
                          f"{g.op} #{g.seq} (group {g.group}) that {join_ranks(g.missing)} "
                          "never entered" for g in (one, other))
        where = ", ".join(f"rank {r} is {describe_rank(window, r)}" for r in ranks)
        summary = f"{join_ranks(ranks)} wait for each other in two groups' collectives: " \
                  f"{sides}; {where}"
        evidence = {**evidence_of(window, ranks[0]), "source": "agent", "group": one.group,
                    "seq": one.seq, "op": one.op, "waiting_ranks": sorted(one.waiting),
                    "crossed": {"group": other.group, "seq": other.seq, "op": other.op,
                                "waiting_ranks": sorted(other.waiting),
                                "missing_ranks": list(other.missing)},
                    "culprits": {str(r): evidence_of(window, r) for r in ranks}}
        return self.caused(ranks, summary, evidence, crossed_cause(
            [(g.group, g.op, g.seq) for g in (one, other)]))

    @staticmethod
    def _outside(window: Window, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """Those of ``ranks`` whose stack shows them outside torch.distributed (a rank that sent
        no dump but waits in a collective too is not blamed)."""
        return tuple(r for r in ranks if r in window.stacks and window.stacks[r].threads
                     and not in_collective(window.stacks[r].main))

    def _from_flight(self, window: Window, gap: FlightGap) -> Finding:
        culprits = gap.missing or self._outside(window, gap.silent)
        waiting = sorted(gap.waiting)
        where = issued_at(gap.waiting[waiting[0]])
        where_from = "flight_recorder" if where else "stacks"
        where = where or rank_evidence(window, waiting[0])["frame"]
        cause = cause_of(window, culprits, waiting)
        named = _named(cause, list(culprits))
        said = ", ".join(f"rank {r} is {describe(window, r)}" for r in gap.missing)
        silent = (f"; {join_ranks(gap.silent)} sent no Flight Recorder dump"
                  if gap.silent else "")
        summary = (f"{join_ranks(culprits)} not in {gap.op} #{gap.seq} (group {gap.group}"
                   f"{':' + gap.group_desc if gap.group_desc else ''}, from the Flight Recorder) "
                   f"that {join_ranks(waiting)} {_wait(waiting)} in"
                   f"{' at ' + where if where else ''}"
                   f"{'; ' + said if said else ''}{silent}")
        return self.caused(named, summary, {
            **rank_evidence(window, named[0]), "source": "flight_recorder",
            "group": gap.group, "group_desc": gap.group_desc, "seq": gap.seq, "op": gap.op,
            "waiting_ranks": waiting, "missing_ranks": list(gap.missing),
            "no_dump_ranks": list(gap.silent), "collective_frame": where,
            "collective_frame_from": where_from,
            "waiting_at": {str(r): {"seq": e.seq, "op": e.op, "state": e.state,
                                    "input_sizes": [list(s) for s in e.input_sizes],
                                    "frames": [str(f) for f in e.frames]}
                           for r, e in sorted(gap.waiting.items())},
            "dumps": sorted(d.path for d in window.flight.values()),
            "culprits": {str(r): rank_evidence(window, r) for r in culprits}}, cause)

    def _from_stacks(self, window: Window, live: set[int]) -> Iterator[Finding]:
        inside = {r for r in live if r in window.stacks and in_collective(window.stacks[r].main)}
        outside = sorted(r for r in live - inside if r in window.stacks and window.stacks[r].threads)
        if inside and outside:
            culprits = ", ".join(f"rank {r} is {describe(window, r)}" for r in outside)
            summary = (f"{join_ranks(outside)} not in the collective that {join_ranks(inside)} "
                       f"{_wait(sorted(inside))} in (seen from stacks); {culprits}")
            yield self.finding(outside, summary, {**rank_evidence(window, outside[0]),
                                                  "source": "stacks",
                                                  "waiting_ranks": sorted(inside)})


def _named(cause: Cause | None, culprits: list[int]) -> list[int]:
    """The ranks a finding names: those missing from the collective, unless they wait in Ray
    Train's barrier that the waiting ranks skipped (those are named then)."""
    if cause is not None and cause.kind == BARRIER_SKIPPED:
        return list(cause.facts["skipped_ranks"])
    return culprits


def _in_engine(window: Window, pair: tuple[MissingFromCollective, ...]) -> bool:
    """Whether either side of a crossed pair waits in its rollout engine's own collective (a
    colocated engine's TP or DP group): the engine cause says more than a crossing does."""
    return any(getattr(cause_of(window, gap.missing, sorted(gap.waiting)), "kind", "")
               == "engine_collective" for gap in pair)


def _one_per_engine_wait(findings: list[Finding]) -> list[Finding]:
    """The findings, less those an engine cause already tells: a rank waits in its engine's
    collective for ranks that wait outside it, each side for the other; the outside ranks'
    own collective, which the engine's rank never entered, is the same deadlock seen from
    their side."""
    told = [f.evidence["cause"] for f in findings
            if f.evidence.get("cause", {}).get("kind") == "engine_collective"]
    return [f for f in findings if not any(
        set(f.ranks) <= set(c["outside_engine"]) and c["engine_rank"] in f.evidence.get(
            "waiting_ranks", ()) for c in told)]


def _wait(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"
