"""SD501 nccl-watchdog-timeout."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator

from stalldoc.analysis.watchdog import align, align_flight
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import describe, join_ranks, rank_evidence
from stalldoc.rules.log_signature import LogSignature, line_rank


class NcclWatchdogTimeout(LogSignature):
    """A collective timed out in PyTorch's NCCL watchdog.

    What it does
        Matches the watchdog's timeout lines of PyTorch 2.1-2.13 behind any prefix
        (``[rankN]:``, ``[E1121 14:02:11.123456 ProcessGroupNCCL.cpp:632]``, ``[Rank N]``,
        ``[PG ID 0 PG GUID 0(default_pg) Rank N]``): ``Watchdog caught collective operation
        timeout: WorkNCCL(SeqNum=N, OpType=X, NumelIn=.., NumelOut=.., Timeout(ms)=..)``,
        ``Timeout at NCCL work: N, last enqueued NCCL work: N, last completed NCCL work: M`` and
        ``Received a dump signal due to a collective timeout from rank N`` (the rank that saw the
        timeout first tells the others through the store), and, with ``TORCH_NCCL_BLOCKING_WAIT=1``
        (older ``NCCL_BLOCKING_WAIT=1``), the waiting thread's own ``[Rank N] Work
        WorkNCCL(SeqNum=N, OpType=X, ...) timed out in blocking wait`` (torch >= 2.5; before, the
        blocking wait raised ``NCCL communicator was aborted on rank N. Original reason for
        failure was: ... Watchdog caught collective operation timeout ...``, matched as such).
        Ascend's torch_npu prints the same watchdog's line for HCCL (``WorkHCCL(SeqNum=N, ...)``,
        behind ``compiler_depend.ts``).
        The collective is then matched:
        with the ranks' Flight Recorder dumps of the stall, exactly (SeqNum is the dump's
        collective_seq_id in that group, DDP's C++ all-reduces included); else with the agents'
        rings, through the printing rank's pending entry (the ring numbers Python calls, not
        c10d's). Who waits in it, who never entered it, and where those ranks are, are named.

    Why is this bad?
        By the time the watchdog fires the job has been stuck for the whole NCCL timeout (10-30
        minutes, or never with swift's ~208-day default); the rank that prints it is usually a
        victim, waiting for a peer that is slow, stuck outside the collective, or dead. The
        watchdog then takes the process down (SD513).

    Evidence
        the lines; ``seq`` and ``op`` of the collective, ``numel_in`` / ``numel_out``,
        ``timeout_ms``, ``last_enqueued`` / ``last_completed`` work, ``pg`` (the group's
        description or id), ``timed_out_rank`` and ``blocking_wait`` (the rank's own wait timed
        out, TORCH_NCCL_BLOCKING_WAIT) where the lines carry them; the global ranks
        that printed them; ``ring``: its ``source`` (``flight_recorder`` or ``agent``), group,
        seq and op in that numbering, waiting / missing / passed ranks, the culprits' frames.

    Fix
        Find the rank that is not in that collective (stalldoc's stall finding, SD101 or SD103,
        names it with its frame) and fix its cause first: a rank in rollout, vLLM or a reward call
        while the others gather is the GRPO classic. Raise the timeout (``--ddp_timeout``,
        ``init_process_group(timeout=...)``) only for collectives that are legitimately slow.

        To record the next one, set ``TORCH_FR_BUFFER_SIZE=2000`` (older torch:
        ``TORCH_NCCL_TRACE_BUFFER_SIZE``) and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, then read the dumps
        with ``torchfrtrace``.

    References
        modelscope/ms-swift#4306 (an ``_ALLGATHER_BASE`` timeout in server mode), OpenRLHF/OpenRLHF#1126 (the dump signal from the rank that timed out),
        pytorch/pytorch#152623, pytorch/pytorch#118369, NVIDIA/nccl#1610 (``[rank13]`` prints
        ``[Rank 1]``: the rank in its group), vllm-project/vllm-omni#2928,
        modelscope/DiffSynth-Studio#458 and sgl-project/sglang#1693 (``Timeout at NCCL work`` of
        a non-default group), huggingface/diffusers#12422 (``timed out in blocking wait``, after
        the watchdog's line), mlfoundations/open_clip#1087 (``NCCL communicator was aborted``
        with NCCL_BLOCKING_WAIT=1 set), vllm-project/vllm-ascend#382 (torch_npu's WorkHCCL);
        PyTorch ProcessGroupNCCL watchdog and Flight Recorder.
    """

    code = "SD501"
    name = "nccl-watchdog-timeout"
    severity = Severity.CRITICAL
    headline = "NCCL watchdog timeout"
    patterns = (
        r"Watchdog caught collective operation timeout: Work(?:NCCL|HCCL)\(SeqNum=(?P<seq>\d+), "
        r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>-?\d+))?(?:, NumelOut=(?P<numel_out>-?\d+))?"
        r"(?:(?:, \w+=[^,)]*)*?, Timeout\(ms\)=(?P<timeout_ms>\d+))?",
        r"Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: (?P<last_enqueued>-?\d+), "
        r"last completed NCCL work: (?P<last_completed>-?\d+)",
        r"Received a dump signal due to a collective timeout from\s+(?:this local rank|"
        r"rank (?P<timed_out_rank>\d+))(?:.*?Last enqueued NCCL work: (?P<last_enqueued>-?\d+), "
        r"last completed NCCL work: (?P<last_completed>-?\d+))?",
        r"Received a timeout signal from this local rank",
        r"Work WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>-?\d+))?"
        r"(?:, NumelOut=(?P<numel_out>-?\d+))?(?:(?:, \w+=[^,)]*)*?, Timeout\(ms\)="
        r"(?P<timeout_ms>\d+))?\) timed out in blocking wait",
    )

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        figures = super().details(match)
        return {**figures, "blocking_wait": True} if "in blocking wait" in match.string else figures

    def check(self, window: Window) -> Iterator[Finding]:
        for finding in super().check(window):
            yield with_rings(window, finding)


def with_rings(window: Window, finding: Finding) -> Finding:
    """The finding with what the agents' rings say about the collective that timed out: the
    printing rank's pending entry, who waits with it, who never entered it and where they are."""
    evidence = finding.evidence
    if "seq" not in evidence:
        return finding
    rank = _printing_rank(evidence["lines"], str(evidence["seq"]))
    if rank is None:
        return finding
    printed_at = float(evidence.get("first_at", window.now))
    live = {r.rank for r in window.ranks} - {e.rank for e in window.exits if e.t < printed_at}
    found = (align_flight(rank, int(evidence["seq"]), evidence.get("pg"), window.flight, live)
             or align(rank, evidence.get("op"), evidence.get("pg"), window.agents, live))
    if found is None:
        return finding
    ring = {"source": found.source, "group": found.group, "seq": found.seq, "op": found.op,
            "op_agrees": found.op_agrees, "waiting_ranks": list(found.waiting),
            "missing_ranks": list(found.missing), "passed_ranks": list(found.passed),
            "frames": [str(f) for f in found.frames],
            "culprits": {str(r): rank_evidence(window, r) for r in found.missing}}
    said = (f"rank {rank}'s watchdog: {evidence.get('op', '?')} SeqNum {evidence['seq']} timed "
            f"out; rank {rank} waits in {found.op} #{found.seq} (group {found.group}"
            f"{', Flight Recorder' if found.source == 'flight_recorder' else ''})")
    seen = "Flight Recorder" if found.source == "flight_recorder" else "ring"
    if found.missing:
        said += (f"; the {seen} shows {join_ranks(found.missing)} never entered #{found.seq}; "
                 + ", ".join(f"rank {r} is {describe(window, r)}" for r in found.missing))
    elif found.passed:
        said += f"; {join_ranks(found.passed)} completed #{found.seq} (ranks disagree)"
    return dataclasses.replace(finding, summary=said, evidence={**evidence, "ring": ring})


def _printing_rank(lines: list[str], seq: str) -> int | None:
    """The rank of the first line that names collective ``seq`` (the line the figures came
    from), else of the first line that names a rank."""
    named = [line for line in lines if re.search(rf"\b{seq}\b", line)] + list(lines)
    return next((rank for line in named if (rank := line_rank(line)) is not None), None)
