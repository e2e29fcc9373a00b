"""Known version clashes: combinations of swift, vLLM, TRL, transformers, DeepSpeed and OpenRLHF
that hang, or fail with an error that never names a version, each with the public thread where
users met it and what fixed it. Read by SD411 (``stalldoc check``, and ``watch`` before it
launches) and by ``stalldoc doctor``.

A row holds when every package it names is installed at a version in its range and, where it
needs one, the command's layout is the one it hangs in (``async_generate``, a rollout server,
ZeRO with gradient accumulation). Ranges compare the leading numbers of a version (``0.8.5.post1``
is 0.8.5), lower bound included, upper bound left out. The rows were checked against the
packages' released source and tags where the thread left a bound open (docs/findings.md, SD411).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from stalldoc.model.launch import LaunchConfig

Version = tuple[int, ...]


def version_tuple(text: str) -> Version:
    """The leading numbers of a version: '2.13.0+cu128' -> (2, 13, 0), '0.8.5.post1' ->
    (0, 8, 5)."""
    numbers = []
    for part in text.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() < len(part):
            break
    return tuple(numbers)


@dataclass(frozen=True)
class Range:
    """A package at a version in [low, high) (``high`` None: no upper bound)."""

    package: str
    low: Version = ()
    high: Version | None = None

    def holds(self, version: str) -> bool:
        found = version_tuple(version)
        return bool(found) and found >= self.low and (self.high is None or found < self.high)

    def __str__(self) -> str:
        low = ".".join(map(str, self.low))
        high = ".".join(map(str, self.high)) if self.high is not None else ""
        if high and low:
            return f"{self.package} >={low},<{high}"
        return f"{self.package} " + (f"<{high}" if high else f">={low}" if low else "(any)")


@dataclass(frozen=True)
class Job:
    """What a layout is read from: the command, and its model's config.json model_type ("":
    not read)."""

    config: LaunchConfig
    model_type: str = ""


def _swift_server(job: Job) -> bool:
    c = job.config
    return c.swift_command == "rollout" or c.value("vllm_mode") == "server" or bool(
        c.value("vllm_server_host"))


def _zero(job: Job, stages: tuple[str, ...] = ("zero2", "zero3")) -> bool:
    return (job.config.value("deepspeed") or "").startswith(stages)


def _zero_with_accumulation(job: Job) -> bool:
    steps = job.config.value("gradient_accumulation_steps") or ""
    return _zero(job) and steps.isdigit() and int(steps) > 1


# the layouts a row may need: its words (said in the finding) and how the job shows it
LAYOUTS: Mapping[str, tuple[str, Callable[[Job], bool]]] = {
    "async": ("with --async_generate", lambda j: j.config.flag("async_generate")),
    "zero3-or-offload": ("under ZeRO-3 or with --offload_model", lambda j: (
        _zero(j, ("zero3",)) or j.config.flag("offload_model"))),
    "swift-server": ("in server mode (swift rollout, or --vllm_mode server)", _swift_server),
    "swift-rollout": ("in `swift rollout`", lambda j: j.config.swift_command == "rollout"),
    "zero-accumulation": ("under ZeRO-2/3 with --gradient_accumulation_steps > 1",
                          _zero_with_accumulation),
    "qwen3-moe-zero": ("for a Qwen3-MoE model under ZeRO-2/3", lambda j: (
        _zero(j) and j.model_type.startswith("qwen3") and "moe" in j.model_type)),
}


@dataclass(frozen=True)
class Clash:
    key: str                       # C01 ... (stable: docs and findings name it)
    ranges: tuple[Range, ...]
    symptom: str
    threads: tuple[str, ...]       # the public threads (issues, PRs) where it was met
    fix: str
    layout: str = ""               # a key of LAYOUTS ("": the versions alone)
    error_line: str = ""           # the line users saw, verbatim ("": none; it hangs)
    confidence: str = "high"       # high / medium: how sure the bounds are (docs/findings.md)


@dataclass(frozen=True)
class ClashSeen:
    """A row that holds for the versions found (``layout``: the command's layout it needs,
    in words, "" when the versions alone make it; ``layout_known``: the command was read)."""

    clash: Clash
    versions: Mapping[str, str]
    layout: str = ""
    layout_known: bool = True

    def said(self, threads: int = 2) -> str:
        """The row as found: its key, the versions, the layout, the symptom and threads."""
        found = " + ".join(f"{p} {v}" for p, v in self.versions.items())
        where = f" {self.layout}" if self.layout else ""
        maybe = "" if self.layout_known else " (if your job runs that way)"
        return (f"{self.clash.key} {found}{where}{maybe}: {self.clash.symptom} "
                f"({', '.join(self.clash.threads[:threads])})")

    def line(self) -> str:
        return f"{self.said()}; fix: {self.clash.fix}"


def clashes_in(versions: Mapping[str, str], job: Job | None) -> list[ClashSeen]:
    """The rows that hold for ``versions`` (package -> version) and the ``job`` (None: not
    known, and a row that needs a layout is told as one that may hold)."""
    seen = []
    for clash in CLASHES:
        if not all(r.package in versions and r.holds(versions[r.package]) for r in clash.ranges):
            continue
        words, shows = LAYOUTS[clash.layout] if clash.layout else ("", None)
        if shows is not None and job is not None and not shows(job):
            continue
        found = {r.package: versions[r.package] for r in clash.ranges}
        seen.append(ClashSeen(clash, found, words, job is not None or shows is None))
    return seen


_V = version_tuple
CLASHES: tuple[Clash, ...] = (
    Clash("C01", (Range("ms-swift", _V("3.2.1"), _V("3.5")), Range("vllm", _V("0.8"))),
          "GRPO's async mode (vLLM on GPUs of its own) may hang with no error",
          ("https://github.com/modelscope/ms-swift/pull/4204",
           "https://github.com/modelscope/ms-swift/blob/v3.4.0/examples/train/grpo/internal/"
           "README.md"),
          "vllm==0.7.3, or ms-swift>=3.5 with --vllm_mode server", layout="async"),
    Clash("C02", (Range("ms-swift", _V("3.3"), _V("3.5")), Range("vllm", _V("0.8"))),
          "GRPO trains nothing: grad_norm stays 0, no error",
          ("https://github.com/modelscope/ms-swift/issues/3887",
           "https://github.com/modelscope/ms-swift/blob/v3.4.0/examples/train/grpo/internal/"
           "README.md"),
          "vllm==0.7.3, or drop --offload_model, or ms-swift>=3.5", layout="zero3-or-offload",
          confidence="medium"),
    Clash("C03", (Range("ms-swift", _V("3.3.1")), Range("vllm", high=_V("0.8.3"))),
          "`swift rollout` fails building its engine (vLLM has no worker_extension_cls)",
          ("https://github.com/modelscope/ms-swift/issues/4202",),
          "vllm>=0.8.3", layout="swift-server",
          error_line="TypeError: EngineArgs.__init__() got an unexpected keyword argument "
                     "'worker_extension_cls'"),
    Clash("C04", (Range("ms-swift", _V("3.3.1"), _V("3.7")), Range("trl", high=_V("0.17"))),
          "`swift rollout` dies resolving TRL's weight-sync worker extension",
          ("https://github.com/modelscope/ms-swift/issues/4248",),
          "pip install -U trl (>=0.17)", layout="swift-rollout", confidence="medium",
          error_line="AttributeError: module 'trl.scripts.vllm_serve' has no attribute "
                     "'WeightSyncWorkerExtension'"),
    Clash("C05", (Range("ms-swift", _V("3.4"), _V("3.6")), Range("vllm", _V("0.9"))),
          "server-mode GRPO hangs at the first weight sync (vLLM V1 will not serialise "
          "torch.dtype; the error is only in the rollout server's log)",
          ("https://github.com/modelscope/ms-swift/pull/4825",),
          "ms-swift>=3.6, or VLLM_ALLOW_INSECURE_SERIALIZATION=1 for the server, or vllm<0.9",
          layout="swift-server", confidence="medium"),
    Clash("C06", (Range("trl", _V("0.17"), _V("0.20")), Range("vllm", _V("0.9"))),
          "`trl vllm-serve` GRPO hangs in update_named_param at group.barrier()",
          ("https://github.com/huggingface/trl/issues/3676",
           "https://github.com/huggingface/trl/pull/3690",
           "https://github.com/vllm-project/vllm/issues/20055"),
          "trl>=0.20, or VLLM_ALLOW_INSECURE_SERIALIZATION=1 for the server"),
    Clash("C07", (Range("trl", _V("0.17")), Range("vllm", high=_V("0.8.3"))),
          "`trl vllm-serve` crashes at start",
          ("https://github.com/huggingface/trl/issues/3304",),
          "pip install 'trl[vllm]' (vllm>=0.8.3)",
          error_line="TypeError: EngineArgs.__init__() got an unexpected keyword argument "
                     "'worker_extension_cls'"),
    Clash("C08", (Range("trl", _V("0.14"), _V("0.16")), Range("vllm", _V("0.7.3"), _V("0.7.4"))),
          "GRPO never leaves step 0: the gather after vLLM's start hangs",
          ("https://github.com/huggingface/trl/pull/2952",
           "https://github.com/huggingface/trl/issues/2977"),
          "trl>=0.16 in server mode (vllm==0.7.2 has C09's error instead)"),
    Clash("C09", (Range("trl", _V("0.14"), _V("0.16")), Range("vllm", _V("0.7.2"), _V("0.7.3"))),
          "the colocated LLM() raises a bare NotImplementedError from is_async_output_supported",
          ("https://github.com/huggingface/trl/issues/2816",
           "https://github.com/vllm-project/vllm/issues/13405"),
          "vllm==0.7.1", confidence="medium"),
    Clash("C11", (Range("trl", _V("0.14"), _V("0.16")), Range("vllm", _V("0.8"))),
          "loading weights into the colocated engine fails: vLLM V1 has no model_executor",
          ("https://github.com/huggingface/trl/issues/3115",
           "https://github.com/vllm-project/vllm/issues/15365"),
          "VLLM_USE_V1=0, or vllm<0.8, or a newer TRL"),
    Clash("C12", (Range("openrlhf"), Range("vllm", _V("0.8.0"), _V("0.8.2"))),
          "the Ray weight-sync setup fails under vLLM V1",
          ("https://github.com/OpenRLHF/OpenRLHF/issues/922",
           "https://github.com/OpenRLHF/OpenRLHF/issues/910"),
          "vllm==0.8.2", confidence="medium",
          error_line="AttributeError: 'LLMEngine' object has no attribute 'model_executor'"),
    Clash("C14", (Range("deepspeed", _V("0.16.0")), Range("transformers", high=_V("4.48"))),
          "the first gradient-accumulation step crashes; the message names no version",
          ("https://github.com/deepspeedai/DeepSpeed/issues/6793",
           "https://github.com/huggingface/transformers/pull/35157"),
          "deepspeed==0.15.4, or --gradient_accumulation_steps 1, or a transformers with "
          "PR 35157", layout="zero-accumulation",
          error_line="AssertionError: no_sync context manager is incompatible with gradient "
                     "partitioning logic of ZeRO stage 3"),
    Clash("C15", (Range("transformers", _V("4.53")), Range("deepspeed")),
          "Qwen3-MoE under ZeRO-2/3 hangs right after loading: the progress bar never moves",
          ("https://github.com/modelscope/ms-swift/issues/5875",
           "https://github.com/deepspeedai/DeepSpeed/issues/7461",
           "https://github.com/huggingface/transformers/issues/39275",
           "https://github.com/hiyouga/LlamaFactory/issues/9222"),
          "transformers<=4.52.4 for MoE models, or make the MoE block a ZeRO-3 leaf module "
          "(deepspeed.utils.set_z3_leaf_modules)", layout="qwen3-moe-zero",
          confidence="medium"),   # no upper bound: still met with transformers 4.57
    Clash("C16", (Range("vllm", _V("0.11"), _V("0.19")), Range("transformers", _V("5"))),
          "the rollout engine dies in its tokenizer's start (vLLM of that range needs "
          "transformers<5)",
          ("https://github.com/rllm-org/rllm/issues/388",
           "https://github.com/vllm-project/vllm/issues/35395"),
          "transformers>=4.57,<5",
          error_line="AttributeError: Qwen2Tokenizer has no attribute "
                     "all_special_tokens_extended"),
    Clash("C18", (Range("trl", high=_V("0.16")), Range("vllm", _V("0.9.1"))),
          "the in-process vLLM times out in its distributed start; the top error hides why",
          ("https://github.com/huggingface/trl/issues/3632",),
          "a TRL of vLLM's time (server or colocate mode), or VLLM_USE_V1=0",
          confidence="medium",
          error_line="RuntimeError: Engine core initialization failed. See root cause above."),
    Clash("C21", (Range("vllm", _V("0.9"), _V("0.10")), Range("transformers", _V("4.54"))),
          "vLLM 0.9 does not run with transformers 4.54+ (open-instruct pinned around it)",
          ("https://github.com/allenai/open-instruct/pull/890",),
          "transformers<4.54, or vllm>=0.10", confidence="medium"),
)
