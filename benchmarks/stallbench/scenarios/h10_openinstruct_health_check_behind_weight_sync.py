"""A Ray health-check call queues behind a blocking weight sync in the vLLM engine actor

source: https://github.com/allenai/open-instruct/pull/1454, https://github.com/allenai/open-instruct/pull/1480
shape: open-instruct grpo_fast on Ray: a driver loop, a learner actor and a vLLM engine actor
  joined by a gloo weight-broadcast group; with inflight updates off, the driver starts the
  engine's update_weight calls, then runs the next step's health check before the learner broadcasts
launch: python
truth: hang
culprit: engine
frame: update_weight
cause: other:actor_call_queued_behind_blocking_call
needs: ray, torch
"""
import os
import socket
import threading

import ray
import torch
import torch.distributed as dist

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 32)
        self.body = torch.nn.Linear(32, 32)
        self.lm_head = torch.nn.Linear(32, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.body(self.embed(tokens))))


@ray.remote(num_cpus=0.5)
class LLMRayActor:
    """The vLLM engine (one actor, default max_concurrency=1: one call at a time)."""

    def __init__(self) -> None:
        jobkit.announce("engine")
        self.model = TinyPolicy()
        self.background = threading.Thread(target=self._prefetch_prompts, daemon=True)
        self.background.start()

    def _prefetch_prompts(self) -> None:
        threading.Event().wait()

    def init_process_group(self, address: str, port: int, rank: int, world: int) -> None:
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))
        jobkit.init(rank=rank, world=world)
        jobkit.announce("engine")

    def generate(self, prompts: torch.Tensor, max_tokens: int = 8) -> torch.Tensor:
        with torch.no_grad():
            tokens = prompts
            for _ in range(max_tokens):
                nxt = self.model(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
        return tokens

    def update_weight(self, name: str, shape: tuple[int, ...]) -> None:
        weight = torch.empty(shape)
        jobkit.hang_begins("the engine waits in update_weight's broadcast; the learner sends only "
                           "after the driver's health check, which queues behind this call")
        dist.broadcast(weight, src=0)
        self.model.get_parameter(name).data.copy_(weight)

    def check_background_threads(self) -> bool:
        return self.background.is_alive()


@ray.remote(num_cpus=0.5)
class PolicyTrainerRayProcess:
    """Learner rank 0 (DeepSpeed on the real cluster); rank 0 of the weight-broadcast group."""

    def __init__(self) -> None:
        jobkit.announce("learner")
        self.model = TinyPolicy()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def init_process_group(self, address: str, port: int, world: int) -> None:
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))
        jobkit.init(rank=0, world=world)
        jobkit.announce("learner")

    def named_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(p.shape)) for name, p in self.model.named_parameters()]

    def train_step(self, step: int, responses: torch.Tensor, scores: torch.Tensor) -> float:
        logits = self.model(responses[:, :-1])
        logprobs = logits.log_softmax(-1).gather(-1, responses[:, 1:, None]).squeeze(-1)
        loss = -(logprobs.mean(-1) * (scores - scores.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(step)
        return loss.item()

    def broadcast_to_vllm(self) -> None:
        for _, param in self.model.named_parameters():
            dist.broadcast(param.data, src=0)


def health_check_fn(engines: list) -> None:
    ray.get([engine.check_background_threads.remote() for engine in engines])


def main() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    learner, engines = PolicyTrainerRayProcess.remote(), [LLMRayActor.remote()]
    ray.get([learner.init_process_group.remote("127.0.0.1", port, 2),
             engines[0].init_process_group.remote("127.0.0.1", port, 1, 2)])
    shapes = ray.get(learner.named_shapes.remote())
    inflight_updates, pending_sync = False, []
    for step in range(12):
        health_check_fn(engines)
        if pending_sync:   # inflight updates off: the learner's broadcast runs after the check
            ray.get(learner.broadcast_to_vllm.remote())
            ray.get(pending_sync)
            pending_sync = []
        prompts = torch.randint(0, 32, (8, 4))
        responses = ray.get(engines[0].generate.remote(prompts))
        scores = (responses[:, 4:] % 2 == 0).float().mean(-1)
        loss = ray.get(learner.train_step.remote(step, responses, scores))
        print(f"step {step}: loss {loss:.4f}", flush=True)
        if step % 3 == 2:
            refs = [engines[0].update_weight.remote(name, shape) for name, shape in shapes]
            if inflight_updates:
                ray.get(learner.broadcast_to_vllm.remote())
                ray.get(refs)
            else:
                pending_sync = refs
    ray.shutdown()


if __name__ == "__main__":
    main()
