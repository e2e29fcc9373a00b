"""PyTorch's debug server (``torch.distributed.debug.start_debug_server``, experimental in 2.13):
every rank starts it after ``init_process_group``; rank 0's frontend writes every rank's Python
stacks (and the Flight Recorder, which on gloo fails with the analyzer's KeyError) to a folder
every 60 s, its default. The collective timeout stays at gloo's default (30 min), so the dumps
are what speaks. Read as a user reads a page of every rank's stacks (``reading.read_stacks``),
timed by the dump's own write."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from arms.reading import Stack, read_stacks
from harness import Diagnosis, Run
from scenario import Scenario, free_port

RANK = re.compile(r"^=== Rank (\d+): ", re.M)
THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", re.M)
FRAME = re.compile(r'^  File "(.+)", line \d+ in (.+)$', re.M)


@dataclass(frozen=True)
class DebugServer:
    name: str = "pytorch_debug"

    def unavailable(self, scenario: Scenario) -> str:
        if "torch" not in scenario.needs:
            return "no torch process group in this scenario"
        try:
            import tabulate  # noqa: F401  (the server's handlers import it)
        except ImportError:
            return "tabulate is not installed (pip install -e '.[bench]')"
        return ""

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        (folder / "dumps").mkdir(parents=True, exist_ok=True)
        return scenario.command(), {"STALLBENCH_DEBUG_DUMPS": str(folder / "dumps"),
                                    "STALLBENCH_DEBUG_PORT": str(free_port())}

    def during(self, run: Run) -> None:
        pass

    def settled(self, run: Run) -> bool:
        """A stacks dump written 5 s or more after the hang began."""
        assert run.hang_at is not None
        return any(p.stat().st_mtime > run.hang_at + 5
                   for p in (run.folder / "dumps").glob("stacks_*.txt"))

    def read(self, run: Run) -> list[Diagnosis]:
        said = []
        for path in sorted((run.folder / "dumps").glob("stacks_*.txt"),
                           key=lambda p: p.stat().st_mtime):
            stacks = parse(path.read_text())
            said += read_stacks(path.stat().st_mtime, stacks, f"debug server ({path.name})")
        return said


def parse(text: str) -> dict[str, Stack | None]:
    """Each rank's main thread in one stacks dump: the thread whose outermost frame is a
    module's body (the other threads are the server's and the job's helpers)."""
    blocks = RANK.split(text)[1:]
    stacks: dict[str, Stack | None] = {}
    for rank, body in zip(blocks[::2], blocks[1::2]):
        threads = [[(m[2], m[1]) for m in FRAME.finditer(part)] for part in THREAD.split(body)[1:]]
        main = next((t for t in threads if t and t[-1][0] == "<module>"), None)
        stacks[rank] = Stack(tuple(main)) if main else None
    return stacks


ARM = DebugServer()
