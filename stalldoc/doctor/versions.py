"""The frameworks in the job's environment, those at a version with a hang or failure that a
rule of ours knows (the rule's code says where it is explained), and whether torch's Flight
Recorder can be dumped on a stall."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from stalldoc.doctor.model import OK, SKIPPED, WARNING, Check
from stalldoc.launch.clashes import clashes_in, version_tuple
from stalldoc.probes.command_env import ALIASES


@dataclass(frozen=True)
class KnownBug:
    package: str
    fixed_in: tuple[int, ...]     # versions below this have it
    code: str                     # the rule that explains it
    what: str


KNOWN_BUGS = (
    KnownBug("vllm", (0, 7, 2), "SD502", "a second model or vLLM on another GPU meets tensors "
             "on two devices (trl#3008, vllm#2108)"),
    KnownBug("vllm", (0, 20, 1), "SD504", "sleep mode with expandable_segments:True breaks the "
             "allocator's pool (vllm#14189), often swallowed, then a hang"),
    KnownBug("ms-swift", (3, 5), "SD403", "async_generate with a colocated vLLM deadlocks "
             "(later versions refuse it)"),
    KnownBug("nccl", (2, 18, 6), "SD517", "ncclUnhandledCudaError on GPUs without working P2P "
             "(NVIDIA/nccl#1024)"),
)
SHOWN = ("torch", "nccl", "vllm", "deepspeed", "ms-swift", "trl", "transformers", "ray",
         "lightning", "pytorch-lightning", "verl", "openrlhf")


def installed(versions: Mapping[str, str], torch_facts: Mapping[str, Any]) -> dict[str, str]:
    """Package -> version, NCCL's taken from torch (what it runs) or from its wheel."""
    out = {k: v for k, v in versions.items() if not k.startswith("nvidia-nccl")}
    for name, alias in ALIASES.items():   # vLLM's CPU build: the same engine, another name
        if name in out:
            out.setdefault(alias, out.pop(name))
    nccl = torch_facts.get("nccl") or next(
        (v for k, v in sorted(versions.items()) if k.startswith("nvidia-nccl")), None)
    if nccl:
        out["nccl"] = str(nccl)
    return out


def check_versions(found: Mapping[str, str]) -> Check:
    shown = ", ".join(f"{name} {found[name]}" for name in SHOWN if name in found)
    facts: dict[str, object] = {"versions": dict(found)}
    hits = [b for b in KNOWN_BUGS if b.package in found
            and version_tuple(found[b.package]) < b.fixed_in]
    clashes = clashes_in(found, None)
    if not found:
        return Check("versions", SKIPPED, "none of the frameworks stalldoc knows is installed "
                     "for the command's python", facts=facts)
    if hits or clashes:
        facts["known_bugs"] = [b.code for b in hits]
        facts["clashes"] = [c.clash.key for c in clashes]
        bugs = "; ".join([f"{b.package} {found[b.package]} < "
                          f"{'.'.join(map(str, b.fixed_in))}: {b.what} ({b.code})" for b in hits]
                         + [f"{c.line()} (SD411)" for c in clashes])
        return Check("versions", WARNING, f"{shown}. Known: {bugs}",
                     "upgrade where the case applies to your job; `stalldoc explain CODE` "
                     "tells more", facts)
    return Check("versions", OK, f"{shown}; none at a version with a hang bug we know",
                 facts=facts)


def check_flight_recorder(torch_facts: Mapping[str, Any]) -> Check:
    if not torch_facts:
        return Check("flight-recorder", SKIPPED, "torch was not read (not installed or not "
                     "importable)")
    facts = {"nccl_dump": bool(torch_facts.get("fr_nccl")),
             "any_backend_dump": bool(torch_facts.get("fr_any"))}
    if torch_facts.get("fr_any") or torch_facts.get("fr_nccl"):
        which = ("NCCL and other backends" if torch_facts.get("fr_any") and
                 torch_facts.get("fr_nccl") else "NCCL only" if torch_facts.get("fr_nccl")
                 else "gloo and other non-NCCL backends")
        return Check("flight-recorder", OK, f"torch {torch_facts.get('torch')} can dump its "
                     f"Flight Recorder on a stall ({which})", facts=facts)
    return Check("flight-recorder", WARNING, f"torch {torch_facts.get('torch')} has no Flight "
                 "Recorder dump: collectives are aligned from the agents' rings only",
                 "upgrade torch for Flight Recorder dumps", facts)
