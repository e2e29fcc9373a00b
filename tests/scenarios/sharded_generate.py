"""Forward passes under parameter sharding (FSDP2's ``fully_shard``, or DeepSpeed ZeRO-3; gloo)
that not every rank runs: each layer's forward all-gathers its parameters from every rank, so a
rank that runs a forward alone waits for ranks that never join.

Sources, kept in structure and names:
- deepspeedai/DeepSpeed#8262 "ZeRO-3 OPSD rollout deadlocks when data-parallel ranks finish
  generation at different lengths": ``generate()`` on a sharded student, different prompts per
  rank; one rank leaves generation while the others wait in the next decode forward's gather.
- facebookresearch/ParlAI#3753: ZeRO-3 "assumes that every worker calls forward the exact same
  number of times"; generation with variable lengths hangs.
- pytorch/pytorch#101294: ``summon_full_params`` entered on rank 0 only hangs (its
  ``rank0_only`` argument misled the user); the same as sampling on rank 0 alone.
- deepspeedai/DeepSpeed#5539: gathering ZeRO-3 parameters for a Hugging Face ``generate`` at the
  end of an epoch; the job timed out in an ``_ALLGATHER_BASE``.
- TensorAuto/OpenTau#462: eval rollouts under ZeRO-3 end at different steps on different ranks,
  so the ranks issue different numbers of all-gathers and hang (fixed with lockstep rollouts,
  the ``synced_gpus`` pattern).

MODE "lengths" (default): for STEPS rollout steps every rank generates from its own prompt with
a greedy decoding loop like ``generate(max_length=...)`` without ``synced_gpus``; prompts are
longer on higher ranks, so rank WORLD-1 makes fewer new tokens, leaves first and waits in the
barrier before the rewards are scored, while the others wait in their next decode step's gather.
A training step (forward, backward, optimizer) follows each rollout. MODE "rank0": every rank
trains STEPS steps, then rank 0 alone generates a sample for the log
(``if rank == 0: generate(...)``) while the others go on to the barrier before saving.

SHARDING "fsdp" (default) or "zero3" (``deepspeed.initialize`` with ZeRO stage 3 and SGD; the
loop calls the engine as a DeepSpeed training loop does).

Environment: MODE, SHARDING, STEPS (default 2), MAX_LENGTH (default 12), LAYERS (default 3).
"""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

MODE = os.environ.get("MODE", "lengths")
SHARDING = os.environ.get("SHARDING", "fsdp")
STEPS = int(os.environ.get("STEPS", "2"))
MAX_LENGTH = int(os.environ.get("MAX_LENGTH", "12"))
LAYERS = int(os.environ.get("LAYERS", "3"))
VOCAB, WIDTH = 32, 16


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = torch.tanh(block(hidden))
        return self.head(hidden)


def shard(model):
    """The model sharded, and its training step: (model, step(ids) -> loss)."""
    if SHARDING == "zero3":
        import deepspeed
        config = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
                  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                  "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
        engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                               model_parameters=model.parameters())

        def zero_step(ids):
            loss = lm_loss(engine(ids[:, :-1]), ids)
            engine.backward(loss)
            engine.step()
            return loss.item()
        return engine, zero_step
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def fsdp_step(ids):
        loss = lm_loss(model(ids[:, :-1]), ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()
    return model, fsdp_step


@torch.no_grad()
def generate(model, ids, max_length):
    """Greedy decoding until the sequence is max_length tokens long (no synced_gpus)."""
    while ids.shape[1] < max_length:
        logits = model(ids)
        ids = torch.cat([ids, logits[:, -1:].argmax(dim=-1)], dim=1)
    return ids


def lm_loss(logits, ids):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, train_step = shard(TinyLM())
    for step in range(STEPS):
        prompt = torch.randint(0, VOCAB, (2, 3 + rank))   # longer prompts on higher ranks
        if MODE == "lengths":
            sequences = generate(model, prompt, MAX_LENGTH)
            print(f"rank {rank} step {step} generated {sequences.shape[1] - prompt.shape[1]} "
                  "tokens", flush=True)
            dist.barrier()   # every rollout in before the reward model scores them
        else:
            sequences = torch.randint(0, VOCAB, (2, MAX_LENGTH))
        print(f"rank {rank} step {step} loss {train_step(sequences):.3f}", flush=True)
    if MODE == "rank0" and rank == 0:
        sample = generate(model, torch.randint(0, VOCAB, (1, 3)), MAX_LENGTH)
        print(f"sample: {sample.tolist()}", flush=True)
    dist.barrier()   # every rank done before rank 0 saves
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
