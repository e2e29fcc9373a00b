"""SD5xx: each log signature against lines in the form the libraries print them (bad) and
look-alike lines that are not the problem (good)."""
from __future__ import annotations

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import by_code

BAD = {
    "SD501": ("[rank1]:[E1121 14:02:11.123456 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
              "collective operation timeout: WorkNCCL(SeqNum=5, OpType=_ALLGATHER_BASE, "
              "NumelIn=1, NumelOut=2, Timeout(ms)=600000) ran for 600011 milliseconds before "
              "timing out.", {"seq": "5", "op": "_ALLGATHER_BASE"}, [1]),
    "SD502": ("RuntimeError: Expected all tensors to be on the same device, but found at least two"
              " devices, cuda:0 and cpu!", {}, []),
    "SD503": ("ValueError: Free memory on device (10.12/79.19 GiB) on startup is less than desired"
              " GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce"
              " GPU memory used by other processes.", {"free_gib": "10.12", "total_gib": "79.19"},
              []),
    "SD504": ("RuntimeError: Expandable segments are not compatible with memory pool. Please track"
              " https://github.com/pytorch/pytorch/issues/147851", {}, []),
    "SD505": ("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62", {}, []),
    "SD506": ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU "
              "3 has a total capacity of 79.19 GiB of which 1.02 GiB is free.",
              {"requested": "2.50 GiB"}, [3]),
    "SD507": ("Exception: Servers not reachable after 240.0s", {"waited_seconds": "240.0"}, []),
    "SD508": ("ValueError: The decoder prompt (length 4120) is longer than the maximum model length "
              "of 4096. Make sure that `max_model_len` is no smaller than the number of text "
              "tokens.", {"prompt_tokens": "4120", "max_model_len": "4096"}, []),
    "SD509": ("[rank0]: Error in async_generate_rollout callback: CUDA error: an illegal memory "
              "access was encountered", {}, [0]),
    "SD510": ("WARNING 11-21 14:03:12 scheduler.py:1560] Sequence group 7 is preempted by "
              "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can "
              "affect the end-to-end performance. Increase gpu_memory_utilization or "
              "tensor_parallel_size to provide more KV cache memory.", {"mode": "RECOMPUTE"}, []),
}

GOOD = {
    "SD501": "[rank0]:[I1121 14:00:00 ProcessGroupNCCL.cpp:900] NCCL watchdog thread started",
    "SD502": "model on device cuda:0; all tensors moved",
    "SD503": "INFO worker.py:250 Memory profiling: the current vLLM instance can use 62.1 GiB; "
             "KV cache memory 40.5 GiB",
    "SD504": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "SD505": "INFO: vLLM sleep mode enabled (cumem allocator)",
    "SD506": "Train: 3/100 memory(GiB) 61.2 out of 80",
    "SD507": "Start connecting to vLLM server 127.0.0.1:8000",
    "SD508": "max_model_len=8192 max_completion_length=1024",
    "SD509": "Inference task submitted",
    "SD510": "INFO gpu_executor.py:122 # GPU blocks: 2048, # CPU blocks: 512; KV cache space ok",
}


def window(*texts: str) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts))


@pytest.mark.parametrize("code", sorted(BAD))
def test_signature_found_with_its_figures(code):
    line, figures, ranks = BAD[code]
    rule = by_code(code)()
    [finding] = rule.check(window("step 3 ok", line, line))
    assert finding.code == code and list(finding.ranks) == ranks
    assert finding.evidence["count"] == 2 and finding.evidence["lines"][0] == line[:400]
    assert {k: finding.evidence[k] for k in figures} == figures
    assert finding.fix == rule.fix and rule.trigger == "tick" and rule.sticky


@pytest.mark.parametrize("code", sorted(GOOD))
def test_look_alike_lines_are_not_findings(code):
    assert list(by_code(code)().check(window(GOOD[code]))) == []


def test_preemption_says_how_much_gpu_memory_sat_unused():
    from stalldoc.model.samples import GpuSample
    gpu = GpuSample(99.0, 0, "GPU-0", "H100", 40 * 2**30, 80 * 2**30, 30, 5, 0.0, 0.0, 200.0, ())
    w = Window(100.0, (), gpus={0: (gpu,)}, log=(LogLine(99.0, "stderr", BAD["SD510"][0]),))
    [finding] = by_code("SD510")().check(w)
    assert finding.evidence["gpu_unused_bytes"] == {"0": 40 * 2**30}
    assert finding.summary.endswith("unused: GPU 0 40.0 GiB")
