"""SD411 version-clash."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.clashes import ClashSeen, Job, clashes_in
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule


class VersionClash(Rule):
    """The job's frameworks are at versions that are known to hang or fail together.

    What it does
        Before launch, reads the versions of ms-swift, vLLM, TRL, transformers, DeepSpeed and
        OpenRLHF installed for the command's own interpreter (a short child of it reads their
        metadata; nothing is imported) and compares them with a table of known clashes, each
        from a public thread (``stalldoc/launch/clashes.py``). A row that hangs only in one
        layout (``--async_generate``, server mode, ZeRO with gradient accumulation, a Qwen3-MoE
        model) holds only when the command asks for it. One finding lists every row that
        holds: a warning where the bounds are sure, information where a bound was inferred.

    Why is this bad?
        These combinations hang with no error (a weight sync that waits for a server whose
        error is only in its own log, an async rollout queue never filled), or fail with a
        message that names a class or a keyword argument, never the version that caused it.
        The user finds the thread after hours of debugging; the versions were known before the
        job started.

    Evidence
        each row that holds: its key, the versions found, the layout it needs, the symptom,
        the error line users saw, the threads and the fix; where the versions were read.

    Fix
        Change the version the row names (its fix says which), or the layout it hangs in.

    References
        docs/findings.md (SD411: the table and its sources); ms-swift PR#4204 (its removed warning: vLLM
        0.8.3 may make some GRPO training hang), PR#4825, issue #3887 (a GRPO hang); TRL issues #3676, #3304, #2977; DeepSpeed#6793; rllm#388.
    """

    code = "SD411"
    name = "version-clash"
    severity = Severity.WARNING
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        resources = window.resources
        if window.config is None or resources is None or not resources.versions:
            return
        model = resources.model.model_type if resources.model else ""
        seen = clashes_in(resources.versions, Job(window.config, model))
        if not seen:
            return
        sure = [s for s in seen if s.clash.confidence == "high"]
        summary = (f"{len(seen)} known version clash{'es' if len(seen) > 1 else ''}: "
                   + "; ".join(s.said(threads=1) for s in seen))
        yield self.finding((), summary, {
            "clashes": [_evidence(s) for s in seen], "versions_from": resources.versions_note},
            fix=f"{seen[0].clash.fix} ({seen[0].clash.key}); see each row's fix.",
            severity=None if sure else Severity.INFO)


def _evidence(seen: ClashSeen) -> dict[str, object]:
    clash = seen.clash
    return {"row": clash.key, "versions": dict(seen.versions), "layout": seen.layout,
            "symptom": clash.symptom, "error_line": clash.error_line,
            "threads": list(clash.threads), "fix": clash.fix, "confidence": clash.confidence,
            "ranges": [str(r) for r in clash.ranges]}
