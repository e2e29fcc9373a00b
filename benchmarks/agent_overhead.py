"""Agent cost: per wrapped collective (target <= 2 us) and step-time ratio of a gloo training
loop with / without the agent (target <= 1.005). Both measured in this run.

    python benchmarks/agent_overhead.py
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.launch.inject import agent_environment  # noqa: E402

MICRO = textwrap.dedent("""
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
    t = torch.ones(1)
    fn = dist.all_reduce
    raw = getattr(fn, "__wrapped__", fn)
    def bench(f, n=20000):
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                f(t)
            best = min(best, (time.perf_counter() - t0) / n)
        return best
    print(bench(raw), bench(fn))
""")

LOOP = textwrap.dedent("""
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    def step():
        model.zero_grad()
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(300):
        step()
    if dist.get_rank() == 0:
        print((time.perf_counter() - t0) / 300)
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env(agent: bool, run_dir: Path) -> dict[str, str]:
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    return agent_environment(run_dir, base, os.getpid()) if agent else base


def micro(run_dir: Path) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", MICRO % free_port()], env=env(True, run_dir),
                         capture_output=True, text=True, check=True)
    raw, wrapped = map(float, out.stdout.split())
    return raw, wrapped


def loop(agent: bool, run_dir: Path) -> float:
    script = run_dir / "loop.py"
    script.write_text(LOOP)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), str(script)],
                         env=env(agent, run_dir), capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw, wrapped = micro(Path(tmp))
        print(f"all_reduce(1 float, world 1): raw {raw * 1e6:.2f} us, wrapped {wrapped * 1e6:.2f} us,"
              f" agent cost {(wrapped - raw) * 1e6:.2f} us per call (target <= 2 us)")
    ratios = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            base, with_agent = loop(False, Path(a)), loop(True, Path(b))
            ratios.append(with_agent / base)
            print(f"gloo loop, 2 ranks, 6 all_reduce/step: {base * 1e3:.3f} ms/step without, "
                  f"{with_agent * 1e3:.3f} ms/step with agent, ratio {with_agent / base:.4f}")
    print(f"median step-time ratio {sorted(ratios)[1]:.4f} (target <= 1.005)")


if __name__ == "__main__":
    main()
