"""SD208 rollout-gpus-idle."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.phase_shares import StepShares, step_shares
from stalldoc.analysis.rollout_gpu import GenerationGpu, generation_gpu
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MOST, SETTLE_SECONDS, cycle_evidence, seconds_text

IDLE = 0.30     # the GPUs' mean utilisation while generating below which they mostly wait


class RolloutGpusIdle(Rule):
    """The rollout takes most of every step while the rank's GPUs sit idle through it.

    What it does
        Every tick, per rank: over its last 3 complete cycles (``SD207``'s measure, the agent's
        own count of each kind of phase), the rollout's and the generation's share; and over
        its recent ticks inside them (up to 120, 10 at least), the mean NVML utilisation of
        the GPUs the rank's processes hold (the rank and its engine's workers). Half of every
        step or more in the rollout, with its GPUs busy less than 30 % of that time, is this
        finding.

    Why is this bad?
        The job is not stuck, it crawls, and the GPUs are not what it waits on. The common
        causes users found: the training GPUs wait while one inference GPU (server mode)
        generates for all of them; too few sequences per engine call to fill the GPU (a
        handful of generations a prompt, prompts not batched across accumulation steps); the
        engine woken from sleep each step, its CUDA graphs re-captured or its memory mapped
        back page by page; the engine bound on the host (tokenising, detokenising, logits
        processors, a reward called inside generation).

    Evidence
        the rollout's share of the cycles and its seconds a step, the GPUs and their mean
        utilisation while generating, the seconds of generation sampled, and every kind's share.

    Fix
        Generate more sequences per engine call (more prompts per generation batch: TRL's
        ``steps_per_generation``, swift's ``--vllm_max_num_seqs``); in server mode colocate the
        engine (``vllm_mode="colocate"``) or give the server more GPUs; with sleep mode,
        compare ``--sleep_level`` 1 and 2.

        A host-bound engine (tokenising, logits processors, a reward called inside generation)
        shows in the engine core's stacks (``stalldoc report``); leave the engine awake between
        steps where its memory allows.

    References
        TRL #2971 (generation 4 of 7 min a step; 7 generations under-use the GPU); TRL PRs
        #3105 / #3162 (one vLLM GPU for 7 training GPUs: 79 s against 36 s); lmm-r1 #76
        (OpenRLHF colocated, GPUs about 40 % busy); verl #5099 (GPU-Util around 40 %); vLLM
        PR #45648 (its author measured CUDA graphs slowing sleep / wake to 6-9 s for a 32B
        model; a reviewer measured 0.47 s without it, and the PR was closed) and RFC #20098
        (graph capture over 10 s).
    """

    code = "SD208"
    name = "rollout-gpus-idle"
    severity = Severity.WARNING
    trigger = "tick"
    settle_seconds = SETTLE_SECONDS

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, reads in sorted(window.kinds.items()):
            gpu = generation_gpu(rank, window.generation.get(rank, ()))
            if gpu is None or gpu.busy >= IDLE:   # no GPU read while generating, or a busy one
                continue
            shares = step_shares(rank, reads)
            if shares is not None and rollout_share(shares) >= MOST:
                yield self.finding([rank], summary(shares, gpu), evidence(shares, gpu))


def rollout_share(shares: StepShares) -> float:
    return shares.share("rollout") + shares.share("generate")


def summary(shares: StepShares, gpu: GenerationGpu) -> str:
    share = rollout_share(shares)
    which = "GPU" if len(gpu.gpus) == 1 else "GPUs"
    return (f"rank {shares.rank} spends {share:.0%} of each step in its rollout "
            f"({seconds_text(share * shares.cycle_seconds)} of "
            f"{seconds_text(shares.cycle_seconds)}) while its {which} "
            f"{', '.join(map(str, gpu.gpus))} {'is' if which == 'GPU' else 'are'} "
            f"busy {gpu.busy:.0%} of that time: the rollout waits on something else")


def evidence(shares: StepShares, gpu: GenerationGpu) -> dict:
    return {**cycle_evidence(shares),
            "rollout_share": round(rollout_share(shares), 3),
            "rollout_seconds": round(rollout_share(shares) * shares.cycle_seconds, 3),
            "gpus": list(gpu.gpus), "gpu_busy": round(gpu.busy, 3),
            "generation_seconds_sampled": round(gpu.seconds, 1), "samples": gpu.samples}
