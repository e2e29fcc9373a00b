"""SD538 sglang-engine-process-died."""
from __future__ import annotations

import dataclasses
import re
import signal
from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import signal_name
from stalldoc.rules.log_signature import LogSignature

_OOM_FIX = ("A SIGKILL nobody asked for is the kernel's OOM killer: check `dmesg -T | grep -i "
            "oom` and the host's memory. Lower what the engine holds (--mem-fraction-static, "
            "--max-running-requests, --chunked-prefill-size) and what the ranks beside it hold in "
            "host memory (CPU offload, dataloader workers), or raise the memory limit, then "
            "restart the engine.")


class SglangEngineProcessDied(LogSignature):
    """A process of an SGLang engine (a scheduler, its data-parallel controller, its tokenizer
    or detokenizer manager) raised and ended, or died.

    What it does
        Matches the lines SGLang itself prints when one of its processes fails (its released
        source: 0.4.6.post5, 0.5.2 and 0.5.23): ``Scheduler hit an exception``, and the same of
        ``DataParallelController``, ``TokenizerManager``, ``DetokenizerManager``,
        ``TpModelWorkerClient`` and the multi-tokenizer routers; ``Received sigquit from a
        child process``, printed by the process that holds the engine when a scheduler told it
        it failed; ``Rank N scheduler is dead`` and ``Rank N scheduler died during
        initialization (exit code: C)``. The scheduler's TP rank is read from SGLang's own
        prefix (``[2025-11-03 18:48:34 TP7]``), the exit code from the line.

    Why is this bad?
        An SGLang engine runs every batch on all of its schedulers: once one is gone, nothing
        more is generated. In a standalone server SGLang kills its own process tree; held by a
        verl or slime actor, that can take the actor with it, and the trainer ranks then wait
        for a rollout that never comes until their collective times out. With data parallelism
        (``--dp-size``) a failed scheduler's signal reaches the data-parallel controller, not
        the engine, which can wait on until its watchdog notices (sgl-project/sglang#40365).

    Evidence
        the lines (the first exception of the traceback printed with ``hit an exception`` is
        the root cause); ``process`` (which of SGLang's processes), ``tp_rank`` (a scheduler's,
        where SGLang's prefix names it), ``scheduler`` and ``exit_code`` (``Rank N scheduler``
        lines), and the signal a negative exit code is (``exit_signal``).

    Fix
        Read the first exception of the traceback after ``hit an exception`` and fix that cause;
        then restart the engine (the job, where an actor holds it; the server, where the
        trainer calls one).

        An NCCL error while the scheduler starts (``ncclCommInitRank``): the engine's GPUs
        cannot reach each other (NCCL_DEBUG=INFO; the GPUs the actor was given). A CUDA out of
        memory: lower --mem-fraction-static, or release the trainer's memory first in a
        colocated run. Exit code -9: the kernel's OOM killer.

    References
        sgl-project/sglang#12567 (a TP7 scheduler's exception in its overlap event loop),
        allenai/olmocr#105 (a TP0 scheduler failed to start, the server exited),
        sgl-project/sglang#8974 (a scheduler's NCCL error at start, then the sigquit line),
        sgl-project/sglang#15235 and gpustack/gpustack#3848 (``Rank 0 scheduler is dead``, then
        exit code -9), sgl-project/sglang#40365 (a DP scheduler's failure does not reach the
        engine).
    """

    code = "SD538"
    name = "sglang-engine-process-died"
    severity = Severity.CRITICAL
    headline = "an SGLang engine process died"
    patterns = (
        r"(?:TP(?P<tp_rank>\d+)\] )?(?P<process>Scheduler|DataParallelController|TokenizerManager"
        r"|DetokenizerManager|TpModelWorkerClient|MultiTokenizerRouter|MultiDetokenizerRouter)"
        r" hit an exception",
        r"Received sigquit from a child process",
        r"Rank (?P<scheduler>\d+) scheduler (?:is dead|died during initialization)"
        r"(?: \(exit code: (?P<exit_code>-?\d+)\))?",
    )

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        """A scheduler's TP rank (SGLang's prefix or line) and its exit code as numbers, and
        the signal a negative exit code is."""
        figures = {k: int(v) if k in ("tp_rank", "scheduler", "exit_code") else v
                   for k, v in super().details(match).items()}
        if figures.get("exit_code", 0) < 0:
            figures["exit_signal"] = signal_name(-figures["exit_code"])
        return figures

    def check(self, window: Window) -> Iterator[Finding]:
        for finding in super().check(window):
            yield self._said(finding)

    def _said(self, finding: Finding) -> Finding:
        """The summary says which process, first: 'its scheduler of TP rank 7 raised an
        exception', 'its scheduler of TP rank 0 died (killed by SIGKILL)'."""
        ev = finding.evidence
        if ev.get("process"):
            who = "scheduler" if ev["process"] == "Scheduler" else ev["process"]
            where = f" of TP rank {ev['tp_rank']}" if "tp_rank" in ev else ""
            says = f"its {who}{where} raised an exception"
        elif ev.get("scheduler") is not None:
            how = (f" (killed by {ev['exit_signal']})" if "exit_signal" in ev else
                   f" (exit code {ev['exit_code']})" if "exit_code" in ev else "")
            says = f"its scheduler of TP rank {ev['scheduler']} died{how}"
        else:
            says = "a scheduler told the process holding the engine that it failed (SIGQUIT)"
        fix = _OOM_FIX if ev.get("exit_code") == -signal.SIGKILL else self.fix
        return dataclasses.replace(finding, summary=f"{self.headline}: {says}", fix=fix)
