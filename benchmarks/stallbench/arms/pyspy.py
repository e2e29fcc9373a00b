"""py-spy by hand: what a user does when a job goes quiet. At the hang (plus a few seconds for
the user to look), ``py-spy dump`` of every rank and part of the job, read as a user reads them
(``reading.read_stacks``)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from arms.reading import Stack, read_stacks
from harness import Diagnosis, Run
from scenario import Scenario

PYSPY = str(Path(sys.executable).with_name("py-spy"))


@dataclass(frozen=True)
class PySpy:
    name: str = "pyspy"
    after: float = 5.0   # seconds from the hang to the dumps

    def unavailable(self, scenario: Scenario) -> str:
        return "" if Path(PYSPY).exists() else "py-spy is not installed"

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        return scenario.command(), {}

    def during(self, run: Run) -> None:
        time.sleep(max(0.0, run.hang_at + self.after - time.time()))
        dumps = {}
        for pid, part in sorted(run.parts.items(), key=lambda item: item[1]):
            shown = subprocess.run([PYSPY, "dump", "--json", "--pid", str(pid)],
                                   capture_output=True, text=True, timeout=60)
            dumps[part] = {"t": time.time(), "pid": pid, "rc": shown.returncode,
                           "threads": json.loads(shown.stdout) if shown.returncode == 0 else [],
                           "error": shown.stderr.strip()[-300:]}
        (run.folder / "pyspy.json").write_text(json.dumps(dumps, indent=1))

    def settled(self, run: Run) -> bool:
        return (run.folder / "pyspy.json").exists()

    def read(self, run: Run) -> list[Diagnosis]:
        path = run.folder / "pyspy.json"
        if not path.exists():
            return []
        return read_dumps(json.loads(path.read_text()))


def read_dumps(dumps: dict) -> list[Diagnosis]:
    t = max((d["t"] for d in dumps.values()), default=0.0)
    return read_stacks(t, {part: _stack(d) for part, d in dumps.items()}, "py-spy")


def _stack(dump: dict) -> Stack | None:
    if dump["rc"] != 0:
        return None
    threads = dump["threads"]
    main = next((t for t in threads if t.get("thread_name") == "MainThread"),
                threads[0] if threads else {"frames": [], "active": True})
    return Stack(tuple((f["name"], f["filename"]) for f in main["frames"]),
                 not main.get("active", True))


ARM = PySpy()
