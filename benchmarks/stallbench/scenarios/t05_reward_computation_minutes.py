"""Healthy: the driver runs each completion's unit tests in a subprocess; scoring takes minutes

source: https://github.com/mit-han-lab/fastrl/issues/6, https://github.com/verl-project/verl/issues/1584
shape: GRPO with a code-execution reward on Ray: after the rollout actor generates, the driver runs
  every completion's tests serially in a fresh Python subprocess (1-2 s each, ~80 s a step) while
  the rollout and learner actors sit idle; slow, not stuck
launch: python
truth: healthy
needs: ray, torch
budget: 130
"""
import os
import subprocess
import sys
import time

import ray
import torch

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")

TEST = """
import time
def add(a, b):
{body}
passed = 0
for trial in range({trials}):
    passed += add(trial, 1) == trial + 1
    time.sleep(0.01)
assert passed == {trials}, f"{{passed}}/{trials} passed"
"""


@ray.remote(num_cpus=0.5)
class RolloutWorker:
    def __init__(self) -> None:
        jobkit.announce("rollout")
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(8, 3)

    def generate(self, n: int) -> list[str]:
        with torch.no_grad():
            picks = self.policy(torch.randn(n, 8)).argmax(-1).tolist()
        bodies = ["    return a + b", "    return b + a", "    return a - b"]
        return [bodies[p] for p in picks]

    def update_weights(self, state: dict) -> None:
        self.policy.load_state_dict(state)


@ray.remote(num_cpus=0.5)
class ActorWorker:
    def __init__(self) -> None:
        jobkit.announce("learner")
        torch.manual_seed(1)
        self.policy = torch.nn.Linear(8, 3)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=1e-3)
        self.steps = 0

    def update_actor(self, rewards: list[float]) -> dict:
        advantages = torch.tensor(rewards) - sum(rewards) / len(rewards)
        logp = self.policy(torch.randn(len(rewards), 8)).log_softmax(-1)[:, 0]
        loss = -(logp * advantages).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(self.steps)
        self.steps += 1
        return self.policy.state_dict()


def code_reward(completion: str, trials: int) -> float:
    snippet = TEST.format(body=completion, trials=trials)
    try:
        done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return 0.0
    return 1.0 if done.returncode == 0 else 0.0


def main() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    rollout, actor = RolloutWorker.remote(), ActorWorker.remote()
    for step, (n, trials) in enumerate([(4, 20), (4, 20), (64, 110)]):
        completions = ray.get(rollout.generate.remote(n))
        if n > 4:
            jobkit.hang_begins("the driver scores 64 completions by running their tests, one "
                               "subprocess each: about 80 s with the actors idle")
        started = time.time()
        rewards = [code_reward(c, trials) for c in completions]
        print(f"step {step}: {len(rewards)} rewards in {time.time() - started:.0f}s, "
              f"mean {sum(rewards) / len(rewards):.2f}", flush=True)
        ray.get(rollout.update_weights.remote(ray.get(actor.update_actor.remote(rewards))))
    ray.shutdown()


if __name__ == "__main__":
    main()
