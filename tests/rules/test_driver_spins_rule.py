"""SD121: a driver or an actor that is no rank busy in one stack, said beside what the rest of
the job does."""
from __future__ import annotations

import pytest

from stalldoc.model.ranks import RankProcess
from stalldoc.model.ray_job import DRIVER, OutsideSeen, RayProcess
from stalldoc.model.window import Window
from stalldoc.rules import by_code


@pytest.mark.parametrize("ranked", [True, False], ids=["ranks-wait", "no-rank"])
def test_a_spinning_driver_is_said_beside_what_the_rest_of_the_job_does(ranked: bool):
    # GIVEN the driver busy in one stack for 700 s, in a job whose ranks wait, or with none
    driver = OutsideSeen(RayProcess(4000, DRIVER), None, "working", busy_for=700.0)
    ranks = (RankProcess(0, 4100, 0, ("python",)),) if ranked else ()
    [finding] = by_code("SD121")().check(Window(100.0, ranks, spinning=(driver,)))
    # THEN it says what the rest of the job does: the ranks wait, or nothing else works
    rest = ("every rank waits for its next task" if ranked
            else "nothing else of the job works (it has no rank)")
    assert finding.summary == ("the driver (pid 4000) has been busy in one unchanging stack "
                               f"for 700 s at an unknown frame while {rest}: a loop that never "
                               "ends?"), finding.summary
