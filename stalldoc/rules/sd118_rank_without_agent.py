"""SD118 rank-without-agent."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule

MISSING = ("collectives and their rings", "phases", "progress markers (optimizer steps)",
           "CUDA allocator figures", "rank claims (Lightning, Ray, mp.spawn)",
           "the faulthandler fallback when py-spy is denied")


class RankWithoutAgent(Rule):
    """A Python rank runs without stalldoc's agent, so half the evidence of it is missing.

    What it does
        Every tick: flags each Python rank whose process wrote no agent state within 3 s of
        being found, with why, from what the process is: its interpreter's flags (``python
        -I`` / ``-E`` / ``-S``), its environment (no ``STALLDOC_AGENT_DIR``: ``env -i`` or a
        wrapper replaced it; a PYTHONPATH without stalldoc's bootstrap), or a fork of a process
        with the agent (a forked child does not carry it). One finding per reason, naming its
        ranks, said when found.

    Why is this bad?
        Without its agent a rank shows no collectives, phases, progress markers or CUDA
        figures, and no faulthandler dump when ptrace is denied: its stall is judged from
        py-spy and the host alone, and a culprit among ranks that ran different collectives
        cannot be named from the rings.

    Evidence
        the ranks, their pids, why, what is missing.

    Fix
        Start python without ``-I`` / ``-E`` / ``-S``, keep ``STALLDOC_AGENT_DIR`` in the
        environment a wrapper passes on, and add to PYTHONPATH instead of replacing it
        (``PYTHONPATH=mine:$PYTHONPATH``); start ranks with spawn rather than fork.
        ``stalldoc doctor -- <command>`` checks a command before a run.

    References
        Python docs, Command line and environment (``-I``, ``-E``, ``-S``) and the ``site``
        module (sitecustomize); ``stalldoc doctor``.
    """

    code = "SD118"
    name = "rank-without-agent"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        pids = {r.rank: r.pid for r in window.ranks}
        by_why: dict[str, list[int]] = {}
        for rank, why in sorted(window.agentless.items()):
            by_why.setdefault(why, []).append(rank)
        for why, ranks in by_why.items():
            yield self.finding(ranks, (
                f"{_ranks(ranks, pids)} without stalldoc's agent: {why}; "
                f"{'its' if len(ranks) == 1 else 'their'} stall is judged from py-spy and the "
                "host alone"),
                {"pids": {str(r): pids.get(r) for r in ranks}, "why": why,
                 "missing": list(MISSING)})


def _ranks(ranks: list[int], pids: dict[int, int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} (pid {pids.get(ranks[0])}) runs"
    return f"ranks {', '.join(map(str, ranks))} run"
