"""A healthy ms-swift GRPO job on CPU, two ranks: ``swift rlhf --rlhf_type grpo`` on the tiny
Qwen2 from tinymodel.py, a JSONL of arithmetic prompts written here, the built-in ``format`` and
``accuracy`` rewards, no vLLM, gloo data parallelism (``--use_cpu true``), an evaluation on a
held-out quarter every SWIFT_EVAL_STEPS steps (default 300), and ``max_steps`` sized to last
RL_MINUTES at SWIFT_SECONDS_PER_STEP (default 0.35 s, measured on a 2-core machine).

Run: ``RL_MINUTES=10 python swift_grpo.py``. It replaces itself with ``swift rlhf`` (exec), so
the process tree is the real one: swift -> torch.distributed.run -> two ``rlhf.py`` ranks.
"""
from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinymodel  # noqa: E402

MINUTES = float(os.environ.get("RL_MINUTES", "10"))
SECONDS_PER_STEP = float(os.environ.get("SWIFT_SECONDS_PER_STEP", "0.35"))
STARTUP_S = 25.0
EVAL_STEPS = os.environ.get("SWIFT_EVAL_STEPS", "300")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def max_steps() -> int:
    return max(3, math.ceil((MINUTES * 60 - STARTUP_S) / SECONDS_PER_STEP))


def argv(model: Path, data: Path, out: Path) -> list[str]:
    swift = str(Path(sys.executable).parent / "swift")
    return [swift, "rlhf", "--rlhf_type", "grpo", "--model", str(model), "--model_type", "qwen2",
            "--template", "qwen", "--dataset", str(data), "--reward_funcs", "accuracy", "format",
            "--tuner_type", "full", "--torch_dtype", "float32", "--num_generations", "4",
            "--per_device_train_batch_size", "4", "--max_completion_length", "24",
            "--max_steps", str(max_steps()), "--num_train_epochs", "1000", "--use_vllm", "false",
            "--report_to", "none", "--logging_steps", "1", "--save_strategy", "no",
            "--dataloader_num_workers", "0", "--dataset_num_proc", "1", "--check_model", "false",
            "--use_cpu", "true", "--ddp_backend", "gloo", "--split_dataset_ratio", "0.25",
            "--eval_strategy", "steps", "--eval_steps", EVAL_STEPS,
            "--per_device_eval_batch_size", "4", "--output_dir", str(out)]


def main() -> None:
    tinymodel.offline()
    model = tinymodel.build_model()
    work = Path(os.environ.get("RL_OUT", "/tmp")) / f"swift-grpo-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    data = tinymodel.write_dataset(work / "data.jsonl", 256)
    os.environ.update(NPROC_PER_NODE="2", MASTER_PORT=str(free_port()))
    command = argv(model, data, work / "out")
    print("swift_grpo:", " ".join(command), flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
