"""ZeRO-3 on-policy distillation: a rank that finishes generate() early stops joining the all-gathers

source: https://github.com/deepspeedai/DeepSpeed/issues/8262
shape: an on-policy distillation step with a ZeRO-3 student and a ZeRO-3 teacher (DeepSpeed on
  the CPU accelerator, gloo, tiny GPT-2s): each rank calls student.generate(synced_gpus=False) on
  its own prompts; rank 0's completion ends after 2 tokens and it moves on to score_with_teacher
  while rank 1 is still decoding (each step all-gathers the student's params). On gloo two
  all-gathers of different sizes abort instead of waiting, so the teacher here is replicated
  (ZeRO-3, persistent params) and its scoring waits in the all-reduce of the score statistics
launch: torchrun 2
truth: hang
culprit: 0
frame: score_with_teacher
cause: collective_mismatch
needs: torch, deepspeed, transformers
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import time

import deepspeed
import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, StoppingCriteria, StoppingCriteriaList

import jobkit

VOCAB = 96


def zero3_config(persist_below: int = 0) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": persist_below},
            "steps_per_print": 1000}


def tiny_gpt2(width: int, layers: int) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=width, n_layer=layers, n_head=2,
                        bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return GPT2LMHeadModel(config)


class CompletionEnded(StoppingCriteria):
    """Stops when the completion reached its end (a short answer on some prompts)."""

    def __init__(self, answer_length: int) -> None:
        self.answer_length, self.generated = answer_length, 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.generated += 1
        return torch.full((input_ids.shape[0],), self.generated >= self.answer_length, dtype=torch.bool)


def rollout(student, prompts: torch.Tensor, answer_length: int) -> torch.Tensor:
    with torch.no_grad():
        return student.module.generate(prompts, max_new_tokens=24, do_sample=True, synced_gpus=False,
                                       stopping_criteria=StoppingCriteriaList([CompletionEnded(answer_length)]),
                                       pad_token_id=1)


def score_with_teacher(teacher, sequences: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logprobs = torch.log_softmax(teacher(sequences).logits, -1)
        stats = torch.stack([logprobs.max(-1).values.sum(), torch.tensor(float(sequences.numel()))])
        dist.all_reduce(stats)   # the DP group's mean teacher log-prob, the baseline for the KL
        return logprobs - stats[0] / stats[1]


def distillation_step(student, teacher, prompts: torch.Tensor, answer_length: int) -> float:
    sequences = rollout(student, prompts, answer_length)
    if answer_length < 24:
        jobkit.hang_begins(f"rank {dist.get_rank()} finished generate() early and runs the teacher "
                           "forward while the other rank still decodes")
    teacher_logprobs = score_with_teacher(teacher, sequences)
    student_logprobs = torch.log_softmax(student(sequences).logits, -1)
    loss = torch.nn.functional.kl_div(student_logprobs, teacher_logprobs, log_target=True,
                                      reduction="batchmean")
    student.backward(loss)
    student.step()
    return float(loss)


def main() -> None:
    rank, world = jobkit.init()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    student_model, teacher_model = tiny_gpt2(32, 2), tiny_gpt2(64, 3)
    student, _, _, _ = deepspeed.initialize(model=student_model, config=zero3_config(),
                                            model_parameters=student_model.parameters())
    teacher, _, _, _ = deepspeed.initialize(model=teacher_model, config=zero3_config(10**9))
    teacher.eval()
    for number in range(20):
        prompts = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator().manual_seed(rank * 50 + number))
        answer_length = 2 if (rank == 0 and number == 3) else 24   # rank 0's prompts have a short answer
        loss = distillation_step(student, teacher, prompts, answer_length)
        jobkit.step(number)
        print(f"rank {rank} step {number} kl {loss:.4f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
