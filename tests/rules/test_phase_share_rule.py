"""SD207: a rank whose weight sync takes most of its last cycles, read from its agent's counts."""
from __future__ import annotations

from stalldoc.model.ranks import RankProcess
from stalldoc.model.window import Window
from stalldoc.rules.sd207_weight_sync_bound import WeightSyncBound
from support import grpo_kind_reads

START = {"weight_sync": 30.0, "generate": 10.0, "step": 5.0}
HEALTHY = {"weight_sync": 0.4, "generate": 5.0, "reward": 1.0, "step": 3.0, "idle": 0.6}


def moe_sync(calls: int) -> dict[str, float]:
    """A cycle whose sync sends ``calls`` tensors, each a call of its own."""
    return {"weight_sync": 6.0, "generate": 2.0, "step": 2.0, "weight_sync_calls": calls}


def window(cycles: list[dict[str, float]]) -> Window:
    rank = RankProcess(0, 4242, 0, ("python", "train.py"))
    return Window(1000.0, (rank,), kinds={0: tuple(grpo_kind_reads(cycles))})


def test_a_sync_taking_most_of_each_step_is_named_with_its_figures():
    [finding] = WeightSyncBound().check(window([START] + [HEALTHY] * 2 + [moe_sync(1200)] * 3))
    assert finding.code == "SD207" and finding.ranks == (0,)
    assert finding.summary == ("rank 0 spends 60% of each step sending its weights to the rollout "
                               "engine (6.0 s of 10 s, rollout to rollout, last 3 steps; 1200 "
                               "sync calls a step: tensor by tensor)")
    assert finding.evidence["shares"]["weight_sync"] == 0.6
    assert finding.evidence["weight_sync_calls_per_cycle"] == 1200
    assert finding.evidence["cycle_seconds"] == 10.0


def test_a_healthy_loop_and_a_slow_start_are_quiet():
    # the first cycle (engines loading, the first sync) is two thirds sync: left out
    assert list(WeightSyncBound().check(window([START] + [HEALTHY] * 5))) == []
    # too few cycles yet to say
    assert list(WeightSyncBound().check(window([START] + [moe_sync(1200)] * 2))) == []


def test_one_bucketed_sync_a_step_is_not_called_tensor_by_tensor():
    [finding] = WeightSyncBound().check(window([START] + [moe_sync(1)] * 4))
    assert "tensor by tensor" not in finding.summary
