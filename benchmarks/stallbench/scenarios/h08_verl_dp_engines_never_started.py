"""verl async rollout with DP=2 on a dense model: the second DP engine is never started, DP rank 0 waits for it

source: https://github.com/verl-project/verl/issues/5607
shape: verl main_ppo on Ray (driver, an FSDP actor-rollout worker, a vLLM async server actor) with
  rollout.data_parallel_size=2 and expert_parallel_size=1: the DP settings reach the engine
  launcher only when EP > 1, so DP engine 1 is never created and the server's DP rank 0 waits
  for it in the DP group's rendezvous; the driver waits in ray.get on the first rollout
  (gloo ranks in Ray actors stand in for vLLM's DP engine processes)
launch: python
truth: hang
culprit: server
frame: init_engine
cause: rendezvous_missing_node
needs: ray, torch
"""
import os
import socket

import ray
import torch

import jobkit



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@ray.remote(num_cpus=0.5)
class ActorRolloutRefWorker:
    """The FSDP actor (a tiny policy here): computes log-probs and updates on rollouts."""

    def init_model(self) -> None:
        jobkit.announce("actor0")
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)

    def update_actor(self, tokens: list[list[int]], rewards: list[float]) -> float:
        batch = torch.tensor(tokens)
        logprobs = torch.log_softmax(self.model(batch[:, :-1]), -1).gather(-1, batch[:, 1:, None])
        advantages = torch.tensor(rewards) - sum(rewards) / len(rewards)
        loss = -(logprobs.squeeze(-1).mean(1) * advantages).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss)


@ray.remote(num_cpus=0.5)
class AsyncvLLMServer:
    """One rollout replica's server: launches the vLLM engine for its DP rank and serves it."""

    def __init__(self, rollout_config: dict, dp_rank: int) -> None:
        jobkit.announce("server")
        self.config, self.dp_rank = rollout_config, dp_rank

    def init_engine(self, master_port: int) -> None:
        config = self.config
        engine_args = {"tensor_parallel_size": config["tensor_model_parallel_size"]}
        if config["expert_parallel_size"] > 1:     # the guard of the thread: dense models skip it
            engine_args.update(data_parallel_size=config["data_parallel_size"],
                               data_parallel_rank=self.dp_rank)
        # the DP group is formed with the replica's configured size; the engine for DP rank 1
        # would have been launched from engine_args, which never got it
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        jobkit.hang_begins("DP rank 0 waits in the DP group's rendezvous for DP rank 1, "
                           "which was never started (data_parallel_size dropped when EP == 1)")
        jobkit.init(rank=self.dp_rank, world=config["data_parallel_size"])
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        tokens = torch.tensor(prompts)
        with torch.no_grad():
            for _ in range(max_tokens):
                tokens = torch.cat([tokens, self.model(tokens[:, -1]).argmax(-1, keepdim=True)], 1)
        return tokens.tolist()


class RayPPOTrainer:
    def __init__(self, config: dict) -> None:
        self.config = config

    def init_workers(self) -> None:
        self.actor_rollout_wg = ActorRolloutRefWorker.remote()
        ray.get(self.actor_rollout_wg.init_model.remote())
        rollout = self.config["rollout"]
        # one server per replica; DP ranks beyond 0 are launched by the engine itself
        self.servers = [AsyncvLLMServer.remote(rollout, 0)]
        self.servers[0].init_engine.remote(free_port())

    def compute_score(self, tokens: list[list[int]]) -> list[float]:
        return [float(sum(t[-4:]) % 5 == 0) for t in tokens]

    def fit(self) -> None:
        for step in range(self.config["total_training_steps"]):
            prompts = [[(step * 13 + i) % 250 + 1, 7, 9] for i in range(8)]
            tokens = ray.get(self.servers[0].generate.remote(prompts, 12))
            loss = ray.get(self.actor_rollout_wg.update_actor.remote(
                tokens, self.compute_score(tokens)))
            jobkit.step(step)
            print(f"step {step}: loss {loss:.4f}", flush=True)


def main() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": jobkit.ray_env()})
    config = {"total_training_steps": 20,
              "rollout": {"name": "vllm", "mode": "async", "data_parallel_size": 2,
                          "tensor_model_parallel_size": 1, "expert_parallel_size": 1}}
    trainer = RayPPOTrainer(config)
    trainer.init_workers()
    trainer.fit()


if __name__ == "__main__":
    main()
