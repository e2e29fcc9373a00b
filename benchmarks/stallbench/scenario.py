"""A scenario: one script under ``scenarios/`` whose docstring carries its label.

    \"\"\"A DDP rank runs out of data one batch early

    source: https://github.com/...
    shape: what the real job did, in a sentence or two
    launch: torchrun 2          (torchrun N | spawn N | python)
    truth: hang                 (hang | healthy)
    culprit: 1                  (ranks, comma separated, or a part the script announces)
    frame: evaluate             (the culprit's own function where it sits)
    cause: rank_outside_collective
    needs: torch                (modules the scenario imports; missing: the scenario is skipped)
    budget: 100                 (seconds from the hang's start the harness waits; default 100)
    python: vllm                (optional: run under the vLLM virtualenv, .venv-vllm, that the
                                 tests build; the default is the interpreter running the bench)
    \"\"\"

Cause kinds (from the research notes): rank_outside_collective, collective_mismatch, dead_rank,
stopped_rank, python_deadlock, waiting_on_server, engine_asleep, engine_out_of_step, engine_dead,
unschedulable, rendezvous_missing_node, io_wait, livelock_spin, cpu_busy, or ``other:<say>``.
"""
from __future__ import annotations

import ast
import functools
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VLLM_PYTHON = HERE.parents[1] / ".venv-vllm" / "bin" / "python"
CAUSES = frozenset({
    "rank_outside_collective", "collective_mismatch", "dead_rank", "stopped_rank",
    "python_deadlock", "waiting_on_server", "engine_asleep", "engine_out_of_step", "engine_dead",
    "unschedulable", "rendezvous_missing_node", "io_wait", "livelock_spin", "cpu_busy"})


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    path: Path
    source: str
    launch: str
    truth: str
    culprits: tuple[str, ...]
    frame: str
    cause: str
    needs: tuple[str, ...]
    budget: float
    python: str = ""

    @property
    def hang(self) -> bool:
        return self.truth == "hang"

    def interpreter(self) -> str:
        return str(VLLM_PYTHON) if self.python == "vllm" else sys.executable

    def missing(self) -> str:
        """The first module this scenario needs that its interpreter lacks ('' if none)."""
        if self.python == "vllm" and not VLLM_PYTHON.exists():
            return ".venv-vllm (python -c 'import vllm_env; vllm_env.python()' in tests/)"
        return _lacking(self.interpreter(), self.needs)

    def command(self) -> list[str]:
        """The launch command, as a user types it."""
        python = self.interpreter()
        kind, _, count = self.launch.partition(" ")
        if kind == "torchrun":
            return [python, "-m", "torch.distributed.run", "--nproc-per-node", count,
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                    str(self.path)]
        return [python, str(self.path)]


@functools.cache
def _lacking(interpreter: str, needs: tuple[str, ...]) -> str:
    """The first of ``needs`` that ``interpreter`` cannot import ('' if none): asked once per
    run of the bench, not once per arm."""
    check = ("import importlib.util as u, sys\n"
             "print(next((m for m in sys.argv[1:] if u.find_spec(m) is None), ''))")
    found = subprocess.run([interpreter, "-c", check, *needs], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else found.stderr.strip()[-200:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load(path: Path) -> Scenario:
    """The scenario in ``path``; a ValueError names what its header lacks."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    title, *rest = doc.splitlines() or [""]
    fields = dict(line.split(":", 1) for line in rest if ":" in line and not line.startswith(" "))
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    missing = [k for k in ("source", "launch", "truth") if not fields.get(k)]
    if fields.get("truth") == "hang":
        missing += [k for k in ("culprit", "frame", "cause") if not fields.get(k)]
    if missing:
        raise ValueError(f"{path.name}: header lacks {', '.join(missing)}")
    cause = fields.get("cause", "")
    if cause and cause not in CAUSES and not cause.startswith("other:"):
        raise ValueError(f"{path.name}: unknown cause {cause!r}")
    return Scenario(path.stem, title.strip(), path, fields["source"], fields["launch"],
                    fields["truth"], _split(fields.get("culprit", "")), fields.get("frame", ""),
                    cause, _split(fields.get("needs", "")), float(fields.get("budget", 100)),
                    fields.get("python", ""))


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def every(folder: Path = HERE / "scenarios") -> list[Scenario]:
    return [load(path) for path in sorted(folder.glob("*.py")) if not path.name.startswith("_")]
