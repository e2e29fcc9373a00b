"""A healthy Ray RL loop on CPU: ``ray.init(num_cpus=2)``, two rollout-worker actors sampling
episodes from a small torch policy (a GRU over a toy token task), a reward actor that scores them
and is now and then slow (10-50 s, like a judge model or a sandbox), and a learner actor that takes
policy-gradient steps; the driver passes the weights with ``ray.put`` each iteration. After a
minute, then every 200 s, the learner runs a long evaluation alone (60-90 s, shorter near the time
limit). Loops until RL_MINUTES are up; exits 0.

Run: ``RL_MINUTES=10 python ray_rl.py``.
"""
from __future__ import annotations

import os
import random
import time

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import ray  # noqa: E402
import torch  # noqa: E402

MINUTES = float(os.environ.get("RL_MINUTES", "10"))
VOCAB, LENGTH, FIRST_EVAL_S, EVAL_EVERY_S = 32, 24, 60.0, 200.0


class Policy(torch.nn.Module):
    """Embedding, GRU, linear head: emits a sequence of tokens one at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64)
        self.gru = torch.nn.GRU(64, 128, batch_first=True)
        self.head = torch.nn.Linear(128, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.gru(self.embed(tokens))
        return self.head(hidden)


def sample(policy: Policy, batch: int, seed: int) -> torch.Tensor:
    """Autoregressive sampling of ``batch`` sequences of LENGTH tokens (token 0 starts them)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(batch, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(LENGTH):
            probs = torch.softmax(policy(tokens)[:, -1], -1)
            tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=generator)], 1)
    return tokens


@ray.remote(num_cpus=0.5)
class RolloutWorker:
    def __init__(self, index: int) -> None:
        self.index, self.policy = index, Policy()

    def rollout(self, weights: dict, step: int) -> torch.Tensor:
        self.policy.load_state_dict(weights)
        return torch.cat([sample(self.policy, 32, step * 100 + self.index * 10 + i)
                          for i in range(8)])


@ray.remote(num_cpus=0.5)
class RewardModel:
    """Rewards ascending runs of tokens; one call in eight waits 10-50 s (a slow judge)."""

    def score(self, episodes: torch.Tensor, step: int) -> torch.Tensor:
        slow = random.Random(step)
        if slow.random() < 0.125:
            time.sleep(slow.uniform(10, 50))
        return (episodes[:, 2:] > episodes[:, 1:-1]).float().mean(1)


@ray.remote(num_cpus=0.5)
class Learner:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-3)

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.policy.state_dict().items()}

    def update(self, episodes: torch.Tensor, rewards: torch.Tensor) -> float:
        """Four REINFORCE epochs over the batch, with a mean baseline."""
        advantage = rewards - rewards.mean()
        for _ in range(4):
            logp = torch.log_softmax(self.policy(episodes[:, :-1]), -1)
            taken = logp.gather(2, episodes[:, 1:, None]).squeeze(2).sum(1)
            loss = -(advantage * taken).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return loss.item()

    def evaluate(self, seconds: float) -> float:
        """A long evaluation alone: sample and score batches for ``seconds``."""
        end, scores, seed = time.monotonic() + seconds, [], 0
        while time.monotonic() < end:
            episodes = sample(self.policy, 64, 10_000 + seed)
            scores.append(float((episodes[:, 2:] > episodes[:, 1:-1]).float().mean()))
            seed += 1
        return sum(scores) / max(1, len(scores))


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    deadline = time.monotonic() + MINUTES * 60
    workers = [RolloutWorker.remote(i) for i in range(2)]
    judge, learner = RewardModel.remote(), Learner.remote()
    step, next_eval = 0, time.monotonic() + FIRST_EVAL_S
    while time.monotonic() < deadline:
        weights = ray.put(ray.get(learner.weights.remote()))
        episodes = torch.cat(ray.get([w.rollout.remote(weights, step) for w in workers]))
        rewards = ray.get(judge.score.remote(episodes, step))
        loss = ray.get(learner.update.remote(episodes, rewards))
        print(f"step {step}: reward {rewards.mean():.3f} loss {loss:.3f}", flush=True)
        step += 1
        seconds = min(random.Random(step).uniform(60, 90), deadline - time.monotonic() - 15)
        if time.monotonic() >= next_eval and seconds >= 30:
            score = ray.get(learner.evaluate.remote(seconds))
            print(f"eval ({seconds:.0f} s): {score:.3f}", flush=True)
            next_eval = time.monotonic() + EVAL_EVERY_S
    print(f"done after {step} steps", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
