"""A rank's shares by kind of phase over its last cycles, from reads of its agent's counts
(``PhaseKinds``) taken near each cycle's start, as the watcher keeps them."""
from __future__ import annotations

import pytest

from stalldoc.analysis.phase_shares import step_shares
from support import grpo_kind_reads as grpo_reads
from support import kind_read as read

SLOW_FIRST = {"weight_sync": 30.0, "generate": 10.0, "step": 5.0}    # engines load, compile
SYNC_BOUND = {"weight_sync": 6.0, "generate": 2.0, "reward": 0.5, "step": 1.0, "idle": 0.5}
HEALTHY = {"weight_sync": 0.2, "generate": 5.0, "reward": 1.0, "step": 3.0, "idle": 0.8}


def test_the_shares_of_the_last_three_cycles_leave_the_first_out():
    reads = grpo_reads([SLOW_FIRST] + [HEALTHY] * 2 + [SYNC_BOUND] * 3)
    shares = step_shares(0, reads)
    assert (shares.cycle_kind, shares.cycles, shares.seconds) == ("rollout", 3, 30.0)
    assert dict(shares.shares) == pytest.approx({
        "train": 0.1, "rollout": 0.0, "generate": 0.2, "reward": 0.05, "weight_sync": 0.6,
        "offload": 0.0, "waiting": 0.0, "other": 0.05})
    assert shares.cycle_seconds == 10.0 and shares.entered("weight_sync") == 3


def test_no_shares_before_three_cycles_past_the_first():
    assert step_shares(0, grpo_reads([SLOW_FIRST] + [SYNC_BOUND] * 2)) is None
    assert step_shares(0, grpo_reads([SLOW_FIRST] + [SYNC_BOUND] * 3)) is not None
    assert step_shares(0, []) is None
    assert step_shares(0, [read(1.0, {"reward": 3}, {"reward": 2.0})]) is None   # no cycles


def test_a_rollout_every_few_steps_is_the_cycle_not_the_step():
    # GIVEN gradient accumulation of 4: four training steps per generation (TRL's default
    # steps_per_generation), the steps' reads kept too
    reads = grpo_reads([SLOW_FIRST] + [HEALTHY] * 4, steps_per_cycle=4)
    shares = step_shares(0, reads)
    assert shares.cycle_kind == "rollout" and shares.cycles == 3
    assert shares.entered("step") == 12


def test_reads_rarer_than_cycles_measure_whole_cycles_between_them():
    # GIVEN cycles shorter than the watcher's tick: some cycles' starts were never read
    reads = grpo_reads([SLOW_FIRST] + [SYNC_BOUND] * 8)
    sparse = [r for i, r in enumerate(reads) if i % 3 != 1]
    shares = step_shares(0, sparse)
    assert shares.cycles >= 3
    assert shares.share("weight_sync") == pytest.approx(0.6)


def test_the_whole_run_is_every_cycle_but_the_first():
    reads = grpo_reads([SLOW_FIRST] + [HEALTHY] * 3 + [SYNC_BOUND] * 3)
    run = step_shares(0, reads, None)
    assert run.cycles == 6 and run.seconds == 3 * 10.0 + 3 * 10.0
    assert run.share("weight_sync") == pytest.approx((3 * 0.2 + 3 * 6.0) / 60.0)


def test_a_loop_with_no_rollout_phase_cycles_on_its_generations():
    reads = [read(10.0 * n, {"generate": n, "weight_sync": 99 * (n - 1)},
                  {"generate": 1.0 * (n - 1), "weight_sync": 8.0 * (n - 1)})
             for n in range(1, 7)]
    shares = step_shares(0, reads)
    assert (shares.cycle_kind, shares.cycles) == ("generate", 3)
    assert shares.share("weight_sync") == pytest.approx(0.8)
    assert shares.share("other") == pytest.approx(0.1)
    assert shares.entered("weight_sync") / shares.cycles == 99


def test_reads_kept_are_those_that_start_a_cycle_and_a_restart_is_seen():
    first = read(1.0, {"step": 1, "rollout": 1}, {})
    same = read(2.0, {"step": 1, "rollout": 1, "weight_sync": 40}, {"weight_sync": 1.0})
    next_step = read(3.0, {"step": 2, "rollout": 1}, {})        # the rollout's cycle goes on
    next_rollout = read(4.0, {"step": 3, "rollout": 2}, {})
    assert first.starts_cycle(None) and next_rollout.starts_cycle(first)
    assert not same.starts_cycle(first) and not next_step.starts_cycle(first)
    one, same_step, two = [read(t, {"step": n}, {}) for t, n in ((1.0, 1), (2.0, 1), (3.0, 2))]
    assert not same_step.starts_cycle(one) and two.starts_cycle(same_step)
    again = read(9.0, {"step": 1, "rollout": 0}, {})
    assert again.restarted(next_rollout) and not next_rollout.restarted(first)
    assert not first.restarted(None)
