"""SD536 vllm-engine-not-started."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.log_signature import MAX_LINES, line_rank

NEEDLE = "core engine proc(s) to "
_WAIT = re.compile(r"Waiting for (?P<local>\d+) local, (?P<remote>\d+) remote core engine "
                   r"proc\(s\) to (?P<stage>start|connect)\b")
_STAMP = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")   # vLLM's own clock: "08-09 20:55:20"
POLL_SECONDS = 10   # vLLM's front end prints the line each time its 10 s poll comes back empty
REPEATS = 10        # lines in the recent log that make a start a slow one (a minute and a half)


class VllmEngineNotStarted(Rule):
    """vLLM's front end keeps waiting for its engine core processes to start.

    What it does
        Every tick, reads vLLM V1's ``Waiting for 1 local, 0 remote core engine proc(s) to
        start.`` (and ``... to connect.``), which the API server or ``LLM`` prints each time its
        10-second poll of the engine cores' handshake comes back empty, and reports it once the
        job's recent output holds it at least 10 times (a minute and a half of waiting). One line,
        or a few, are a normal start: loading weights, capturing CUDA graphs and compiling take
        that long. A warning: the engine may still come up.

    Why is this bad?
        The process that prints it does nothing else until the engine core answers: a trainer
        that waits on its rollout engine (colocated vLLM, a GRPO / PPO rollout worker, a ``vllm
        serve`` it polls) waits with it, GPUs idle. The engine core has often died without its
        front end noticing (an exception, OOM, a NCCL init that never finished), or is still
        downloading weights, compiling (torch.compile, CUDA graphs, FlashInfer / DeepGEMM JIT)
        or waiting for GPU memory another process holds; vLLM gives up only after
        ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s by default).

    Evidence
        the lines and how many the recent output holds (``count``); ``local`` / ``remote`` (the
        engine cores not yet started), ``stage`` (start or connect), ``waited_seconds`` (from
        the lines' own clock, or the count at vLLM's 10 s poll); the global ranks that printed
        them, where a line names one.

    Fix
        Read the engine core's own log (``EngineCore`` / ``Worker_TP*`` lines): a traceback means
        it died; loading or ``Capturing CUDA graphs`` lines mean it is slow, not stuck. Check that
        no other process holds its GPUs' memory (``nvidia-smi``); raise
        ``VLLM_ENGINE_READY_TIMEOUT_S`` only for a start that is slow but progressing.

        Slow starts shrink with ``enforce_eager=True`` (no CUDA graphs), a warm torch.compile
        cache, weights already on local disk, and fewer data-parallel engines per node; a core
        that waits on NCCL at start (TP > 1) needs the same NCCL settings as the trainer's.

    References
        vllm-project/vllm#24133 (GLM-4.5 on 8xH100: the engine never came up after loading),
        Project-HAMi/HAMi-core#261 (vLLM 0.25 with TP > 1 on shared GPUs: the line every 10 s,
        for minutes), vllm-project/vllm-omni#5122 (a start stuck in loading weights),
        vllm-project/vllm-ascend#2416, vllm-project/vllm#17676 (the front end waits forever),
        vllm-project/vllm#32116 (the engine ready timeout during a DeepGEMM warm-up).
    """

    code = "SD536"
    name = "vllm-engine-not-started"
    severity = Severity.WARNING
    trigger = "tick"
    sticky = True

    def check(self, window: Window) -> Iterator[Finding]:
        new = [(line, match) for line in window.log if (match := _waiting(line.text))]
        if not new:
            return
        recent = [text for text in window.log_tail if _waiting(text)]
        texts = recent if len(recent) > len(new) else [line.text for line, _ in new]
        if len(texts) < REPEATS:
            return
        evidence = _evidence(new, texts)
        ranks = sorted({r for line, _ in new if (r := line_rank(line.text)) is not None})
        yield self.finding(ranks, _summary(evidence), evidence)


def _waiting(text: str) -> re.Match[str] | None:
    return _WAIT.search(text) if NEEDLE in text else None


def _evidence(new: list[tuple[LogLine, re.Match[str]]], texts: list[str]) -> dict[str, Any]:
    last_line, last = new[-1]
    return {"lines": [t.strip()[:400] for t in texts][:MAX_LINES], "count": len(texts),
            "first_at": new[0][0].t, "last_at": last_line.t,
            "last_line": last_line.text.strip()[:400], "local": last["local"],
            "remote": last["remote"], "stage": last["stage"],
            "waited_seconds": _waited(texts)}


def _waited(texts: list[str]) -> int:
    """Seconds between the first and the last line by vLLM's own clock; where the lines carry
    none, the count at its poll interval."""
    stamps = [s for t in texts if (s := _stamp(t)) is not None]
    if len(stamps) >= 2 and stamps[-1] >= stamps[0]:
        return int((stamps[-1] - stamps[0]).total_seconds())
    return (len(texts) - 1) * POLL_SECONDS


def _stamp(text: str) -> datetime | None:
    match = _STAMP.search(text)
    try:
        return datetime.strptime(match.group(1), "%m-%d %H:%M:%S") if match else None
    except ValueError:      # 02-29: no such day in strptime's default year
        return None


def _summary(evidence: dict[str, Any]) -> str:
    cores = f"{evidence['local']} local, {evidence['remote']} remote"
    return (f"vLLM's front end has waited {evidence['waited_seconds']} s for its engine core "
            f"({cores}) to {evidence['stage']} ({evidence['count']} lines): whatever waits on "
            "this engine (a trainer's rollouts) waits with it; the engine core's own log says "
            "whether it died or is still loading")
