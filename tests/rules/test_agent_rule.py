"""SD118: a rank without its agent is said, with why and what is missing."""
from __future__ import annotations

from stalldoc.model.ranks import RankProcess
from stalldoc.model.window import Window
from stalldoc.rules import by_code

RANKS = (RankProcess(0, 4100, 0, ("python", "train.py")),
         RankProcess(1, 4101, 1, ("python", "-I", "train.py")))


def test_a_rank_without_its_agent_is_said_with_why():
    window = Window(10.0, RANKS, agentless={1: "python -I: isolated mode (-I) ignores "
                                             "PYTHONPATH and skips the user's site"})
    [finding] = by_code("SD118")().check(window)
    assert finding.ranks == (1,) and finding.evidence["pids"] == {"1": 4101}
    assert finding.summary.startswith("rank 1 (pid 4101) runs without stalldoc's agent: python "
                                      "-I: isolated mode"), finding.summary
    assert "collectives and their rings" in finding.evidence["missing"]


def test_ranks_with_their_agents_are_not_said():
    assert list(by_code("SD118")().check(Window(10.0, RANKS))) == []


def test_ranks_kept_out_the_same_way_are_one_finding():
    why = "its PYTHONPATH does not hold stalldoc's bootstrap: a wrapper set its own"
    window = Window(10.0, RANKS, agentless={0: why, 1: "python -I: isolated mode"})
    assert [f.ranks for f in by_code("SD118")().check(window)] == [(0,), (1,)]
    [both] = by_code("SD118")().check(Window(10.0, RANKS, agentless={0: why, 1: why}))
    assert both.ranks == (0, 1) and both.summary.startswith(
        f"ranks 0, 1 run without stalldoc's agent: {why}"), both.summary
