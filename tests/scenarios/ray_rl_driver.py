"""An RL loop run by a Ray driver, as verl's and OpenRLHF's are, without either: the driver holds
the loop and scores the samples itself, LEARNERS ``PolicyLearner`` actors train in one gloo world
(their RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT in ``runtime_env`` env_vars, as verl's
``RayWorkerGroup`` gives them), with CRITICS (default 0) a second worker group of ``ValueCritic``
actors in a gloo world of their own (verl's critic beside its actor), and one
``GenerationServer`` actor outside any world generates (a
copy of the policy, weights synced to it after every update, as OpenRLHF's vLLM engine actors
are).

Per step: the server generates a batch; the driver scores it (``score_batch``: a small reward
model, SCORE_SECONDS of work with its stack moving from module to module, default 0.5, from
step SCORE_FROM on, default 0; 0.5 s before it) and
normalises the scores; the learners train on it (backward, an all_reduce of the gradients); the
driver hands the new weights to the server (``load_weights``, not awaited, as an asynchronous
weight sync is) and, every step, asks the server whether it is healthy (``ping``) with a
deadline of PING_TIMEOUT seconds (default 600). Prints ``step S reward R loss L`` each step.

HANG picks what goes wrong at step HANG_STEP (default 2):
- ``normaliser``: the batch is degenerate (every score equal), the normaliser's fixed-point loop
  divides by a zero spread, gets NaN and never converges: the driver spins in ``normalise``
  (pure Python, on the CPU) while every learner and the server wait for their next call; it
  gives up after GIVE_UP seconds (default 600), or once the file STOP_FILE exists (looked at
  about once a second: the user who read the warning and stops the job), and the job exits 1.
- ``reward_server``: the driver asks a remote verifier at REWARD_URL for the rewards, with no
  timeout, and the verifier never answers: the driver waits on its socket.
- ``weight_sync``: the server's ``load_weights`` joins a weight-sync group (gloo, world 2,
  the server as rank 1) whose trainer side never comes: it waits in torch's rendezvous; the
  driver's ``ping`` is queued behind it (an actor runs one call at a time), and the driver
  waits in ``ray.get`` until PING_TIMEOUT, then exits 1.
With SERVER_GPUS (say 1) the server asks for that many GPUs, which a node without any never
has: it is never created, the learners are up and idle, and the driver's first call to it
waits until GIVE_UP. With POOL_CPUS (say 64) the loop, once its learners are created, reserves the rollout
engines' pool, a placement group of two bundles of that many CPUs packed on one node, which no
node can hold: ``ray.get(pool.ready())`` waits until GIVE_UP. With SERVER_RAISES the server's ``__init__`` raises a RuntimeError with those words: the
actor dies in its creation task and the loop's first call to it raises. With TASK_RUNNER=1 the loop runs in a ``TaskRunner`` actor that the
driver starts and waits on, as verl's ``main_ppo`` does. Before the step that hangs it prints ``hang HANG from T`` (T: the time, in seconds since the
epoch). Without HANG the loop runs STEPS steps (default 6) and exits 0."""
import json
import math
import os
import socket
import time
import urllib.request

import ray

LEARNERS = int(os.environ.get("LEARNERS", "2"))
CRITICS = int(os.environ.get("CRITICS", "0"))
STEPS = int(os.environ.get("STEPS", "6"))
HANG = os.environ.get("HANG", "")
HANG_STEP = int(os.environ.get("HANG_STEP", "2"))
SCORE_SECONDS = float(os.environ.get("SCORE_SECONDS", "0.5"))
SCORE_FROM = int(os.environ.get("SCORE_FROM", "0"))
PING_TIMEOUT = float(os.environ.get("PING_TIMEOUT", "600"))
GIVE_UP = float(os.environ.get("GIVE_UP", "600"))
TASK_RUNNER = os.environ.get("TASK_RUNNER", "") == "1"
SERVER_GPUS = float(os.environ.get("SERVER_GPUS", "0"))
SERVER_RAISES = os.environ.get("SERVER_RAISES", "")
POOL_CPUS = float(os.environ.get("POOL_CPUS", "0"))
STOP_FILE = os.environ.get("STOP_FILE", "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Learner:
    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        self.model = torch.nn.Linear(16, 4)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def train_step(self, rewards: list) -> float:
        import torch
        import torch.distributed as dist

        loss = self.model(torch.randn(8, 16)).square().mean() * (1 + sum(rewards) / 100)
        self.optimizer.zero_grad()
        loss.backward()
        for param in self.model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        self.optimizer.step()
        return loss.item()

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


@ray.remote(num_cpus=1)
class PolicyLearner(Learner):
    """verl's actor worker group."""


@ray.remote(num_cpus=1)
class ValueCritic(Learner):
    """verl's critic worker group: the same training, in a world of its own."""


@ray.remote(num_cpus=0)
class GenerationServer:
    def __init__(self) -> None:
        import torch

        if SERVER_RAISES:   # the engine cannot start here, as a vLLM engine without a GPU
            raise RuntimeError(SERVER_RAISES)
        self.model = torch.nn.Linear(16, 4)
        self.version = 0

    def generate(self, step: int) -> list:
        import torch

        with torch.no_grad():
            out = self.model(torch.randn(16, 16)).argmax(dim=-1)
        return [int(t) for t in out]

    def load_weights(self, weights: dict, join_port: int) -> int:
        if join_port:   # the weight-sync group: this server is rank 1, the trainer never comes
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{join_port}",
                                    world_size=2, rank=1)
        self.model.load_state_dict(weights)
        self.version += 1
        return self.version

    def ping(self) -> int:
        return self.version


def reward_model():
    import torch

    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Embedding(8, 64), torch.nn.Linear(64, 256),
                               torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 1))


def tokenize(sample: int, length: int = 32) -> list:
    return [(sample * 7 + i * 3) % 8 for i in range(length)]


def score_batch(model, samples: list, degenerate: bool, seconds: float) -> list:
    """The reward: the model's score of each sample, for ``seconds`` of work."""
    import torch

    if degenerate:
        return [1.0 for _ in samples]
    deadline, scores = time.monotonic() + seconds, []
    while not scores or time.monotonic() < deadline:
        with torch.no_grad():
            batch = torch.tensor([tokenize(s) for s in samples])
            scores = model(batch).mean(dim=(1, 2)).tolist()
    return scores


def score_remote(samples: list) -> list:
    """The reward from a remote verifier (a sandbox, a judge model) at REWARD_URL, no timeout."""
    request = urllib.request.Request(f"{os.environ['REWARD_URL']}/score",
                                     data=json.dumps({"samples": samples}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read())["scores"]


def normalise(scores: list, tolerance: float = 1e-6) -> list:
    """Whiten the scores until they stop changing (a fixed point): a batch whose scores are all
    equal has no spread, its NaNs never compare below the tolerance."""
    started = look_at = time.monotonic()
    current = scores
    while True:
        mean = sum(current) / len(current)
        spread = math.sqrt(sum((v - mean) ** 2 for v in current) / len(current))
        whitened = [(v - mean) / spread if spread else math.nan for v in current]
        if max(abs(a - b) for a, b in zip(whitened, current)) < tolerance:
            return whitened
        current = whitened
        now = time.monotonic()
        if now > look_at:   # about once a second
            if now - started > GIVE_UP or (STOP_FILE and os.path.exists(STOP_FILE)):
                raise RuntimeError("the reward normaliser did not converge")
            look_at = now + 1


def make_group(actor, size: int) -> list:
    """A worker group: ``size`` actors in a gloo world of their own."""
    port = free_port()
    group = []
    for rank in range(size):
        env_vars = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        group.append(actor.options(runtime_env={"env_vars": env_vars}).remote())
    return group


def reserve_pool() -> None:
    """The rollout pool, reserved before anything runs on it."""
    from ray.util.placement_group import placement_group

    pool = placement_group([{"CPU": POOL_CPUS}] * 2, strategy="STRICT_PACK", name="rollout_pool")
    print(f"hang placement_group from {time.time():.3f}", flush=True)
    ray.get(pool.ready(), timeout=GIVE_UP)


def rl_loop() -> None:
    learners, model = make_group(PolicyLearner, LEARNERS), reward_model()
    critics = make_group(ValueCritic, CRITICS)
    if POOL_CPUS:   # the engines' pool reserved once the trainers are up, as OpenRLHF does
        reserve_pool()
    server = GenerationServer.options(num_gpus=SERVER_GPUS).remote()
    if SERVER_GPUS:
        print(f"hang placement from {time.time():.3f}", flush=True)
        ray.get(server.ping.remote(), timeout=GIVE_UP)
    for step in range(STEPS):
        hang = HANG if step == HANG_STEP else ""
        if hang:
            print(f"hang {hang} from {time.time():.3f}", flush=True)
        samples = ray.get(server.generate.remote(step))
        rewards = normalise(score_remote(samples) if hang == "reward_server"
                            else score_batch(model, samples, hang == "normaliser",
                                             SCORE_SECONDS if step >= SCORE_FROM else 0.5))
        losses = ray.get([learner.train_step.remote(rewards) for learner in learners + critics])
        server.load_weights.remote(ray.get(learners[0].weights.remote()),
                                   free_port() if hang == "weight_sync" else 0)
        ray.get(server.ping.remote(), timeout=PING_TIMEOUT)
        print(f"step {step} reward {sum(rewards):.3f} loss {losses[0]:.4f}", flush=True)


@ray.remote(num_cpus=0)
class TaskRunner:
    """verl's main_ppo: the driver only starts this actor and waits; the loop runs in it."""

    def run(self) -> None:
        rl_loop()


def main() -> None:
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(num_cpus=LEARNERS + CRITICS)
    try:
        if TASK_RUNNER:
            ray.get(TaskRunner.remote().run.remote())
        else:
            rl_loop()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
