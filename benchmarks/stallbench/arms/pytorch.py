"""PyTorch's own tools, as its docs set them up on gloo: a collective timeout
(``init_process_group(timeout=60 s)``; the default, 30 min for gloo, would make every run half an
hour), the Flight Recorder recording (``TORCH_FR_BUFFER_SIZE=2000``, the tutorial's value) and
dumped by each rank on its way out (gloo has no watchdog that dumps: jobkit writes
``_dump_fr_trace()`` when a collective raises or the launcher's SIGTERM comes, the code a user
adds), then the tutorial's analyzer, ``torchfrtrace --prefix rank_ DIR``. Read as a user reads it:
the timeout names the rank that timed out, never a culprit; the analyzer's ``missing ranks`` and
``Culprit rank`` lines do."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import Diagnosis, Run, output
from scenario import Scenario

ANALYZER = str(Path(sys.executable).with_name("torchfrtrace"))
TIMEOUT_LINES = re.compile(r"Timed out waiting|Connection closed by peer|DistBackendError|"
                           r"Socket Timeout|wait timeout after")
MISSING = re.compile(r"missing ranks: \{([\d, ]+)\}")
CULPRIT = re.compile(r"Culprit rank (\d+)")


@dataclass(frozen=True)
class PyTorch:
    name: str = "pytorch"
    timeout: float = 60.0

    def unavailable(self, scenario: Scenario) -> str:
        return "" if "torch" in scenario.needs else "no torch process group in this scenario"

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        (folder / "fr").mkdir(parents=True, exist_ok=True)
        return scenario.command(), {"STALLBENCH_PG_TIMEOUT": str(self.timeout),
                                    "TORCH_FR_BUFFER_SIZE": "2000",
                                    "STALLBENCH_FR_DUMP": str(folder / "fr" / "rank_")}

    def during(self, run: Run) -> None:
        pass

    def read(self, run: Run) -> list[Diagnosis]:
        said = [Diagnosis(t, frozenset(), "", "", f"timeout: {line.strip()[:200]}")
                for t, line in output(run) if TIMEOUT_LINES.search(line)][:1]
        return said + self._analyzed(run)

    def _analyzed(self, run: Run) -> list[Diagnosis]:
        dumps = sorted((run.folder / "fr").glob("rank_*"))
        if not dumps:
            return []
        ranks = [p for p in run.parts.values() if p.isdigit()]
        incomplete = ["--allow-incomplete-ranks"] if len(dumps) < len(ranks) else []
        began = time.time()
        shown = subprocess.run([ANALYZER, "--prefix", "rank_", *incomplete, str(run.folder / "fr")],
                               capture_output=True, text=True, timeout=300)
        (run.folder / "fr_trace.txt").write_text(shown.stdout + shown.stderr)
        # said when the last dump was written plus the analyzer's own time
        t = max(p.stat().st_mtime for p in dumps) + (time.time() - began)
        text = shown.stdout + shown.stderr
        culprits = {c for m in MISSING.finditer(text) for c in re.split(r"[, ]+", m[1]) if c}
        culprits |= set(CULPRIT.findall(text))
        if shown.returncode != 0 and not culprits:
            last = (text.strip().splitlines() or ["(no output)"])[-1]
            return [Diagnosis(t, frozenset(), "", "", f"fr_trace failed: {last[:200]}")]
        cause = ("collective_mismatch" if CULPRIT.search(text) else
                 "rank_outside_collective" if MISSING.search(text) else "")
        return [Diagnosis(t, frozenset(culprits), "", cause,
                          f"fr_trace: {' '.join(text.split())[:200]}")] if culprits or cause else []


ARM = PyTorch()
