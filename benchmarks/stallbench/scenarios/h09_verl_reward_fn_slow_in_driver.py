"""The Ray driver of a GRPO job is stuck scoring one degenerate sample; workers sit idle

source: https://github.com/verl-project/verl/pull/6673
shape: verl-style GRPO on Ray: the driver (RayPPOTrainer.fit) calls a rollout actor and a learner
  actor each step and scores completions serially in the driver (NaiveRewardManager ->
  compute_score -> normalize_final_answer); one sample makes the answer normaliser backtrack forever
launch: python
truth: hang
culprit: driver
frame: normalize_final_answer
cause: cpu_busy
needs: ray, torch
"""
import os
import re
import time

import ray
import torch

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


@ray.remote(num_cpus=0.5)
class RolloutWorker:
    """Generates completions with the current policy (a tiny GRU language model)."""

    def __init__(self) -> None:
        jobkit.announce("rollout")
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 32)
        self.rnn = torch.nn.GRU(32, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 16)

    def generate_sequences(self, prompts: list[str], step: int) -> list[str]:
        alphabet = "0123456789 +=$\\{"
        out = []
        with torch.no_grad():
            for prompt in prompts:
                tokens = torch.tensor([[len(prompt) % 16]])
                hidden, text = None, []
                for _ in range(12):
                    y, hidden = self.rnn(self.embed(tokens), hidden)
                    tokens = self.head(y[:, -1]).argmax(-1, keepdim=True)
                    text.append(alphabet[int(tokens)])
                out.append(prompt + " = " + "".join(text))
        if step == 3:   # the policy has drifted into emitting one long run of digits
            out[5] = prompts[5] + " = \\boxed{" + " ".join(["1" * 22 + "$"] * 50000) + "}"
        return out

    def update_weights(self, state: dict) -> None:
        self.head.load_state_dict(state)


@ray.remote(num_cpus=0.5)
class ActorWorker:
    """The policy learner (FSDP on the real cluster; one process here)."""

    def __init__(self) -> None:
        jobkit.announce("learner")
        self.head = torch.nn.Linear(32, 16)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=1e-3)
        self.step = 0

    def update_actor(self, rewards: list[float]) -> dict:
        advantages = torch.tensor(rewards) - sum(rewards) / len(rewards)
        logits = self.head(torch.randn(len(rewards), 32))
        loss = -(logits.log_softmax(-1)[:, 0] * advantages).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(self.step)
        self.step += 1
        return {k: v.detach().clone() for k, v in self.head.state_dict().items()}


def normalize_final_answer(answer: str) -> str:
    """Strip the boxed wrapper, then keep the parts that are numbers, as math_dapo's normaliser
    does (its number check backtracks on a long run of digits with a unit sign after it)."""
    answer = answer.split("\\boxed{")[-1].rstrip("}")
    normalized = []
    for part in answer.split(" "):
        if re.match(r"^(\d+\s?)+$", part):
            normalized.append(part)
        time.sleep(0.01)
    return " ".join(normalized) if normalized else answer


def compute_score(solution: str, ground_truth: str) -> float:
    return 1.0 if normalize_final_answer(solution).strip() == ground_truth else 0.0


class NaiveRewardManager:
    def __init__(self, ground_truths: list[str]) -> None:
        self.ground_truths = ground_truths

    def __call__(self, completions: list[str], step: int) -> list[float]:
        scores = []
        for number, (completion, truth) in enumerate(zip(completions, self.ground_truths)):
            if step == 3 and number == 5:
                jobkit.hang_begins("the driver scores a degenerate completion: the answer "
                                   "normaliser backtracks on it for hours")
            scores.append(compute_score(completion, truth))
        return scores


def fit() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    rollout, actor = RolloutWorker.remote(), ActorWorker.remote()
    prompts = [f"{a} + {a + 3}" for a in range(8)]
    reward_fn = NaiveRewardManager([str(2 * a + 3) for a in range(8)])
    for step in range(20):
        completions = ray.get(rollout.generate_sequences.remote(prompts, step))
        rewards = reward_fn(completions, step)
        state = ray.get(actor.update_actor.remote(rewards))
        ray.get(rollout.update_weights.remote(state))
        print(f"step {step}: reward {sum(rewards) / len(rewards):.3f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    fit()
