"""SD409 vllm-memory-budget."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.config import LaunchConfig, deepspeed_of, number
from stalldoc.launch.plan import setting
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import plan_of
from stalldoc.rules.telemetry import gib

TRAINING_BYTES_PER_PARAM = 16   # bf16 weights + grads, fp32 Adam m, v and master weights


class VllmMemoryBudget(Rule):
    """vLLM's memory share cannot hold the model and a useful KV cache (or leaves no room for
    training when colocated).

    What it does
        Before launch, with a local model (config.json) and the GPU memory known: vLLM's budget
        is vllm_gpu_memory_utilization x GPU memory. The weights per GPU (parameters x bytes /
        tensor parallel size) must fit in it, and the rest must hold the KV cache of at least one
        sequence of vllm_max_model_len — else an error; room for fewer sequences than vLLM will
        batch (vllm_max_num_seqs, default B x TP x S) is a warning. Colocated without
        offload_model or sleep mode, the training model's own share (16 bytes per parameter,
        divided over the ranks under ZeRO-3) plus vLLM's budget above the GPU memory is a warning.

    Why is this bad?
        Too small a budget (a reported hang: 0.5 for a 32B model) leaves vLLM a KV cache for a
        handful of sequences: rollouts preempt and crawl (SD510) or vLLM refuses to start (SD503);
        too large a budget next to a resident training model runs out of memory at wake-up.

    Evidence
        parameters, weights per GPU, KV bytes per token and per sequence, the budget, the room
        left, sequences that fit, the training share.

    Fix
        Raise vllm_gpu_memory_utilization towards 0.6-0.7 (when colocated, offload the training
        model during rollout: offload_model / sleep_level 1), raise vllm_tensor_parallel_size, or
        lower vllm_max_model_len / vllm_max_num_seqs.

    References
        the community article "Swift GRPO training of a 32B model hangs" (Chinese, 2025); vLLM
        memory profiling (weights + activations + KV cache).
    """

    code = "SD409"
    name = "vllm-memory-budget"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config, res = window.config, window.resources
        if config is None or res is None or res.model is None or not res.gpu_memory \
                or not config.is_grpo or not config.flag("use_vllm"):
            return
        model, memory = res.model, res.gpu_memory
        tp = int(number(config, "vllm_tensor_parallel_size") or 1)
        budget = int((number(config, "vllm_gpu_memory_utilization") or 0.9) * memory)
        weights = model.weight_bytes // tp
        length = int(number(config, "vllm_max_model_len") or model.max_position_embeddings or 0)
        per_seq = model.kv_bytes_per_token * length // tp
        fit = (budget - weights) // per_seq if per_seq else None
        ev = {"params": model.params, "weights_per_gpu": weights, "budget": budget,
              "gpu_memory": memory, "kv_bytes_per_sequence": per_seq, "max_model_len": length,
              "sequences_that_fit": fit, "tensor_parallel_size": tp}
        head = f"vLLM budget {gib(budget)} per GPU, weights {gib(weights)} at TP={tp}"
        if weights >= budget:
            yield self.finding((), f"{head}: the weights alone do not fit", ev)
        elif fit is not None and fit < 1:
            yield self.finding((), f"{head}: {gib(budget - weights)} left, less than one "
                                   f"{length}-token sequence's KV cache ({gib(per_seq)})", ev)
        elif fit is not None and fit < self._batched(config):
            yield self.finding((), f"{head}: KV cache for {fit} sequences of {length} tokens, "
                                   f"fewer than the {self._batched(config)} vLLM will batch", ev,
                               severity=Severity.WARNING)
        yield from self._colocated(window, weights, budget, memory, ev)

    @staticmethod
    def _batched(config: LaunchConfig) -> int:
        """vllm_max_num_seqs, or swift 4.x's default B x TP x S."""
        given = number(config, "vllm_max_num_seqs")
        if given:
            return int(given)
        steps = number(config, "steps_per_generation") or setting(config,
                                                                  "gradient_accumulation_steps")
        return int(setting(config, "per_device_train_batch_size")
                   * (number(config, "vllm_tensor_parallel_size") or 1) * steps)

    def _colocated(self, window: Window, weights: int, budget: int, memory: int,
                   ev: dict) -> Iterator[Finding]:
        config = window.config
        assert config is not None and window.resources and window.resources.model
        if (config.value("vllm_mode") or "colocate") != "colocate" or config.flag("offload_model") \
                or (number(config, "sleep_level") or 0) > 0:
            return
        plan = plan_of(window)
        ds = deepspeed_of(config)
        ranks = plan.world_size if plan and ds and ds.stage == 3 else 1
        training = window.resources.model.params * TRAINING_BYTES_PER_PARAM // ranks
        if training + budget > memory:
            yield self.finding((), f"colocated: training needs ~{gib(training)} per GPU and vLLM "
                                   f"takes {gib(budget)} of {gib(memory)}; no offload_model or "
                                   "sleep_level", {**ev, "training_per_gpu": training},
                               severity=Severity.WARNING)
