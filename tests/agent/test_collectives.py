"""The collective wrappers inside a real gloo process (world size 1)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from stalldoc.run.inject import agent_environment

JOB = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    import stalldoc
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
    sub = dist.new_group([0])
    with stalldoc.phase("step"):
        dist.all_reduce(torch.ones(10, dtype=torch.bfloat16))
        dist.all_gather([torch.zeros(3)], torch.ones(3), group=sub)
        dist.all_gather_object([None], {"a": 1})
        dist.barrier()
    print(os.getpid())
""")


def test_collectives_land_in_the_ring_once_each(tmp_path):
    from support import free_port, run_with_agent
    state = run_with_agent(tmp_path, JOB % free_port())
    world = next(g for g in state.groups if g.name == "world")
    assert [(r.op, r.numel, r.dtype, r.completed) for r in world.ring] == [
        ("all_reduce", 10, "bfloat16", True), ("all_gather_object", 1, "object", True),
        ("barrier", 0, "none", True)]
    [other] = [g for g in state.groups if g.name != "world"]
    assert [(r.op, r.numel) for r in other.ring] == [("all_gather", 3)]
    assert state.collective_seq == 4
    assert [p.name for p in state.phases] == ["step"]


def test_a_process_without_torch_never_imports_it(tmp_path):
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert list((tmp_path / "agents").glob("agent-*.state"))


def test_the_agent_loads_only_its_own_modules(tmp_path):
    """The agent runs in every process of the job: the watcher's parts (model, launch, rules,
    the state reader) never load there; the engines' facts (data only) do, for its claims."""
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    code = "import sys; print(' '.join(m for m in sys.modules if m.startswith('stalldoc')))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    loaded = set(out.stdout.split())
    assert "stalldoc.agent.runtime" in loaded
    assert {m for m in loaded if m != "stalldoc" and not m.startswith("stalldoc.agent.")} \
        == {"stalldoc.agent", "stalldoc.engines", "stalldoc.engines.facts",
            "stalldoc.engines.vllm", "stalldoc.engines.sglang"}
    assert "stalldoc.agent.state_reader" not in loaded


NEW_NAMES = textwrap.dedent("""
    import os, warnings, torch, torch.distributed as dist
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
    out = torch.empty(6)
    dist.all_gather_into_tensor(out, torch.ones(6))      # deprecated: calls all_gather_single
    dist.all_gather_single(out, torch.ones(6))
    dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
    dist.reduce_scatter_single(torch.empty(6), torch.ones(6))
    print(os.getpid())
""")


def test_torch_2_13_collective_names_are_recorded_once_each(tmp_path):
    """torch 2.13 deprecates all_gather_into_tensor for all_gather_single (which it calls): a
    ZeRO-3 gather is one entry either way, and the new names are seen."""
    from support import free_port, run_with_agent
    state = run_with_agent(tmp_path, NEW_NAMES % free_port())
    world = next(g for g in state.groups if g.name == "world")
    assert [(r.op, r.numel, r.is_async) for r in world.ring] == [
        ("all_gather_into_tensor", 6, False), ("all_gather_single", 6, False),
        ("all_reduce_coalesced", 5, False), ("reduce_scatter_single", 6, False)]
