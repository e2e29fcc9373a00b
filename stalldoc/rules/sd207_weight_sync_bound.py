"""SD207 weight-sync-bound."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.phase_shares import StepShares, step_shares
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MOST, SETTLE_SECONDS, cycle_evidence, seconds_text

PER_TENSOR_CALLS = 8    # weight-sync calls per cycle from which the sync goes tensor by tensor


class WeightSyncBound(Rule):
    """Sending the trainer's weights to the rollout engine takes most of every step.

    What it does
        Every tick, per rank: over its last 3 complete cycles (a cycle from one start of its
        rollout to the next; its generation, or its training step, where it has no rollout),
        the first cycle left out, the share of the time spent in weight-sync phases as the
        innermost phase (swift's ``_move_model_to_vllm``, TRL's ``sync_weights``, vLLM's
        ``reload_weights`` and weight-update calls, the weight-sync clients of TRL and swift
        server mode, PyNccl broadcasts). Half of the time or more is this finding. Measured by
        the rank's agent: each phase's time is counted when it starts and ends, whatever the
        sampling.

    Why is this bad?
        The job is not stuck, it crawls: the GPUs wait while the weights go over one tensor at
        a time. A MoE model has tens of thousands of expert tensors, and a sync that pushes
        them one by one pays a call each (about 40 s for Qwen3-30B-A3B in TRL, 50 s in
        OpenRLHF before chunking, 55 s of a 60 s step in verl); a LoRA run that merges the
        adapter and pushes the whole model each step pays the full model.

    Evidence
        the share of the cycles in weight sync, the seconds of sync and of a cycle, the weight
        sync calls per cycle (many: one per tensor), and the other kinds' shares (train,
        rollout, generate, reward, offload, waiting, other).

    Fix
        Send the weights in buckets, not tensor by tensor (swift server mode: a larger
        ``SWIFT_UPDATE_WEIGHTS_BUCKET_SIZE``; OpenRLHF: ``--vllm_sync_backend nccl``); with
        LoRA, sync only the adapter (``--vllm_enable_lora``); a MoE under ZeRO-3: Megatron.

        TRL server mode sends each parameter in a request of its own: colocate instead. ZeRO-3
        gathers each expert of a MoE apart; swift's maintainers advise Megatron for MoE RL.
        OpenRLHF's default sync backend was gloo.

    References
        TRL #3557 (MoE weight sync about 40 s); OpenRLHF #533 (sync over 40 % of the time) and
        PR #593 (chunked broadcast, 50 s to 5 s); verl #6974 (a delta weight sync for dense
        models: 9 to 37 s a sync); ms-swift #9719 (a MoE step under ZeRO-3 takes 8 to 9 min;
        the maintainers advise Megatron); ms-swift docs, GRPO server mode (SWIFT_UPDATE_WEIGHTS_BUCKET_SIZE).
    """

    code = "SD207"
    name = "weight-sync-bound"
    severity = Severity.WARNING
    trigger = "tick"
    settle_seconds = SETTLE_SECONDS

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, reads in sorted(window.kinds.items()):
            shares = step_shares(rank, reads)
            if shares is not None and shares.share("weight_sync") >= MOST:
                yield self.finding([rank], self._summary(shares), evidence(shares))

    @staticmethod
    def _summary(shares: StepShares) -> str:
        calls = shares.entered("weight_sync") / shares.cycles
        how = f"; {calls:.0f} sync calls a step: tensor by tensor" \
            if calls >= PER_TENSOR_CALLS else ""
        return (f"rank {shares.rank} spends {shares.share('weight_sync'):.0%} of each step "
                f"sending its weights to the rollout engine "
                f"({seconds_text(shares.share('weight_sync') * shares.cycle_seconds)} of "
                f"{seconds_text(shares.cycle_seconds)}, "
                f"{shares.cycle_kind} to {shares.cycle_kind}, last {shares.cycles} steps{how})")


def evidence(shares: StepShares) -> dict:
    """The shares of a rank's cycles, as a finding's evidence."""
    return {**cycle_evidence(shares),
            "weight_sync_seconds": round(shares.share("weight_sync") * shares.cycle_seconds, 3),
            "weight_sync_calls_per_cycle": round(shares.entered("weight_sync") / shares.cycles, 1)}
