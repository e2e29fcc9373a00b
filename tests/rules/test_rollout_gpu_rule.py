"""SD208: a rank whose rollout takes most of its last cycles while its GPUs sit idle in it."""
from __future__ import annotations

from stalldoc.model.ranks import RankProcess
from stalldoc.model.samples import GenerationSample
from stalldoc.model.window import Window
from stalldoc.rules.sd208_rollout_gpu_idle import RolloutGpusIdle
from support import grpo_kind_reads

START = {"generate": 30.0, "step": 5.0}
ROLLOUT_BOUND = {"generate": 7.0, "reward": 0.5, "step": 2.0, "idle": 0.5}
TRAIN_BOUND = {"generate": 3.0, "reward": 0.5, "step": 6.0, "idle": 0.5}


def window(cycles: list[dict[str, float]], util: int, samples: int = 40,
           gpus: tuple[int, ...] = (3,)) -> Window:
    rank = RankProcess(0, 4242, 0, ("python", "train.py"))
    generation = tuple(GenerationSample(100.0 + i, 1.0, tuple((g, util) for g in gpus))
                       for i in range(samples))
    return Window(1000.0, (rank,), kinds={0: tuple(grpo_kind_reads(cycles))},
                  generation={0: generation})


def test_a_rollout_taking_most_of_each_step_on_an_idle_gpu_is_named_with_its_figures():
    [finding] = RolloutGpusIdle().check(window([START] + [ROLLOUT_BOUND] * 4, util=12))
    assert finding.code == "SD208" and finding.ranks == (0,)
    assert finding.summary == ("rank 0 spends 70% of each step in its rollout (7.0 s of 10 s) "
                               "while its GPU 3 is busy 12% of that time: the rollout waits on "
                               "something else")
    assert finding.evidence["gpu_busy"] == 0.12 and finding.evidence["rollout_share"] == 0.7
    assert finding.evidence["generation_seconds_sampled"] == 40.0


def test_busy_gpus_a_train_bound_step_and_too_few_samples_are_quiet():
    assert list(RolloutGpusIdle().check(window([START] + [ROLLOUT_BOUND] * 4, util=85))) == []
    assert list(RolloutGpusIdle().check(window([START] + [TRAIN_BOUND] * 4, util=5))) == []
    assert list(RolloutGpusIdle().check(window([START] + [ROLLOUT_BOUND] * 4, util=5,
                                               samples=9))) == []
    # no GPU read at all (NVML off, or no GPU held by the rank): nothing to say
    assert list(RolloutGpusIdle().check(window([START] + [ROLLOUT_BOUND] * 4, util=5,
                                               samples=0))) == []


def test_several_gpus_are_named_together():
    [finding] = RolloutGpusIdle().check(window([START] + [ROLLOUT_BOUND] * 4, util=20,
                                               gpus=(0, 1)))
    assert "while its GPUs 0, 1 are busy 20% of that time" in finding.summary
