"""How busy a rank's GPUs are while it generates: kept per tick by the watcher's history from
the ticks the probes give (the agents' phases, NVML's GPUs with their processes' ranks)."""
from __future__ import annotations

import dataclasses

import pytest

from stalldoc.analysis.rollout_gpu import generating, generation_gpu
from stalldoc.sidecar.history import Histories
from support import synthetic_tick


def ticks_with(utils: list[int], stack: tuple[str, ...], start: float = 100.0) -> Histories:
    """A 2-rank job's history over ticks 0.5 s apart: the ranks in ``stack``, each tick's
    utilisation of every GPU given."""
    history = Histories()
    for i, util in enumerate(utils):
        tick = synthetic_tick(start + 0.5 * i, 2, 2, "x")
        agents = {r: dataclasses.replace(a, phase_stack=stack) for r, a in tick.agents.items()}
        gpus = tuple(dataclasses.replace(g, util_gpu=util) for g in tick.gpus)
        history.add(dataclasses.replace(tick, agents=agents, gpus=gpus))
    return history


@pytest.mark.parametrize("stack,expected", [
    (("step", "rollout", "generate", "forward"), True),     # vLLM's forward inside generation
    (("step", "rollout"), True),
    (("step", "rollout", "weight_sync"), False),     # a weight sync is no generation
    (("step", "forward"), False), ((), False)])
def test_generating_is_the_innermost_phase_of_a_kind(stack, expected):
    assert generating(stack) is expected


def test_a_ranks_gpu_busy_while_it_generates_is_weighted_by_time():
    history = ticks_with([0, 10, 10, 10, 30, 30, 30, 30, 50, 50, 50],
                         ("step", "rollout", "generate"))
    samples = history.generation_samples()
    # the first tick has no time before it; then each rank's own GPU (rank 0 on GPU 0)
    assert len(samples[0]) == 10 and {s.gpus[0][0] for s in samples[0]} == {0}
    figure = generation_gpu(0, samples[0])
    assert figure is not None and figure.gpus == (0,) and figure.seconds == pytest.approx(5.0)
    assert figure.busy == pytest.approx(0.30)
    assert generation_gpu(0, samples[0][:9]) is None          # too few to say


def test_a_rank_training_gives_no_generation_samples():
    assert Histories().generation_samples() == {}
    assert ticks_with([0] * 12, ("step", "forward")).generation_samples() == {}
