"""Which launch checks could not look at a command, and why: a check that had nothing to read
(the command is not swift GRPO, the processes or the GPUs are unknown, the model is not a local
directory) stays quiet, so "no findings" alone would claim more than was checked."""
from __future__ import annotations

from stalldoc.launch.plan import GrpoPlan
from stalldoc.model.launch import LaunchConfig, Resources

GRPO_CHECKS = "the swift GRPO checks (SD401-SD403, SD405-SD410)"
BATCH_CHECKS = "the batch arithmetic (SD406-SD408) and the plan"


def unchecked(config: LaunchConfig, resources: Resources, plan: GrpoPlan | None,
              gpus: int | None) -> tuple[str, ...]:
    """'what (why)' for each launch check that had nothing to read; ``gpus``: the GPUs the job
    can use as the rules saw them (None: unknown)."""
    out = [*_command(config, plan)]
    if gpus is None:
        out.append("processes vs GPUs (SD404): the node's GPUs are unknown (NVML sees none "
                   "here; give --gpus)")
    if config.is_grpo:
        out += _model(config, resources)
    if not resources.versions:
        out.append(f"version clashes (SD411): the command's frameworks are unknown "
                   f"({resources.versions_note or 'not read'})")
    return tuple(out)


def _command(config: LaunchConfig, plan: GrpoPlan | None) -> list[str]:
    if config.swift_command is None:
        program = " ".join(p for p in (config.launcher, config.program) if p)
        return [f"{GRPO_CHECKS}: not a swift command ({program or 'empty'})"]
    if not config.is_grpo:
        return [f"{GRPO_CHECKS}: swift {config.swift_command or ''} is not "
                "`swift rlhf --rlhf_type grpo`".replace("  ", " ")]
    if plan is None:
        return [f"{BATCH_CHECKS}: the number of processes is unknown (give --nproc_per_node "
                "or NPROC_PER_NODE)"]
    return []


def _model(config: LaunchConfig, resources: Resources) -> list[str]:
    """The checks that need the model's sizes or the GPUs' memory."""
    out = []
    needs_model = [what for what, needed in (
        ("vLLM memory budget (SD409)", config.flag("use_vllm")),
        ("checkpoint size (SD410)", (config.value("tuner_type") or "lora") == "full"))
        if needed]
    if needs_model and resources.model is None:
        out.append(f"model size: {', '.join(needs_model)} ({resources.model_note})")
    if config.flag("use_vllm") and not resources.gpu_memory:
        out.append("vLLM memory budget (SD409): the GPUs' memory is unknown (give --gpu-memory)")
    return out
