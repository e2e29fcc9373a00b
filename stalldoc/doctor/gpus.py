"""The GPUs as ``watch`` will see them: NVML (driver, GPUs, per-process memory, which a container
may hide), and CUDA as the job's torch sees it (in a child of the job's interpreter)."""
from __future__ import annotations

import os
import time

from stalldoc.doctor.children import MARK, run_child
from stalldoc.doctor.model import OK, PROBLEM, SKIPPED, WARNING, Check
from stalldoc.probes.interpreter import Target
from stalldoc.probes.nvml import NvmlProbe

DEVICE_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia/version")
NVML_FIX = ("install the NVIDIA driver's NVML (libnvidia-ml.so.1) where stalldoc runs; in a "
            "container, run it with the NVIDIA container toolkit (--gpus all, or "
            "NVIDIA_DRIVER_CAPABILITIES including utility)")
TORCH_CUDA = f"""
import json
import torch
out = {{"torch": torch.__version__, "cuda_build": torch.version.cuda,
        "available": torch.cuda.is_available()}}
out["devices"] = torch.cuda.device_count() if out["available"] else 0
try:
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
except Exception:
    out["nccl"] = None
c10d = getattr(torch._C, "_distributed_c10d", None)
out["fr_nccl"] = hasattr(c10d, "_dump_nccl_trace")
out["fr_any"] = hasattr(c10d, "_dump_fr_trace")
print({MARK!r} + json.dumps(out), flush=True)
"""


def check_nvml() -> Check:
    probe = NvmlProbe()
    why = probe.start()
    try:
        if why:
            if not any(os.path.exists(p) for p in DEVICE_FILES):
                return Check("nvml", SKIPPED, f"no NVIDIA GPU on this node ({why})")
            return Check("nvml", PROBLEM, f"this node has an NVIDIA driver but {why}: watch "
                         "will see no GPU memory, utilisation or PCIe traffic (SD201-SD206 off)",
                         NVML_FIX)
        return _gpus(probe)
    finally:
        probe.stop()


def _gpus(probe: NvmlProbe) -> Check:
    gpus = probe.sample(time.time())
    facts: dict[str, object] = {"driver": probe.driver_version(), "gpus": len(gpus),
                                "names": sorted({g.name or "?" for g in gpus})}
    seen = f"{len(gpus)} GPU(s) ({', '.join(facts['names'])}), driver {facts['driver']}"
    procs = [p for g in gpus for p in (g.processes or ())]
    if any(g.processes is None for g in gpus):
        return Check("nvml", WARNING, f"{seen}; NVML refuses the GPUs' process lists: watch "
                     "cannot tell which rank holds which GPU memory", NVML_FIX, facts)
    if not procs:
        return Check("nvml", OK, f"{seen}; no process on them now, so per-process memory was "
                     "not tried (stalldoc doctor --gpu starts one)", facts=facts)
    hidden = [p.pid for p in procs if not os.path.exists(f"/proc/{p.pid}")]
    unknown = [p.pid for p in procs if p.used_bytes is None]
    facts.update(processes=len(procs), foreign_pids=hidden, memory_unknown=unknown)
    if unknown or hidden:
        return Check("nvml", WARNING, f"{seen}; of {len(procs)} GPU process(es) "
                     f"{len(hidden)} have pids this PID namespace does not hold and "
                     f"{len(unknown)} no memory figure: watch cannot map their memory to "
                     "ranks (a container without the host's PID namespace)",
                     "run the container with --pid=host (Kubernetes: hostPID: true) to map "
                     "GPU memory to ranks", facts)
    return Check("nvml", OK, f"{seen}; per-process memory readable ({len(procs)} process(es))",
                 facts=facts)


def check_cuda(target: Target, versions: dict[str, str]) -> tuple[Check, dict[str, object]]:
    """CUDA as the job's torch sees it; also what the child learnt of torch (for the Flight
    Recorder check)."""
    if "torch" not in versions:
        return Check("cuda", SKIPPED, f"torch is not installed for {target.python[0]}"), {}
    seen, why = run_child(target.argv, TORCH_CUDA, target.env, timeout=120)
    if seen is None:
        return Check("cuda", PROBLEM, f"importing torch in {target.python[0]}: {why}",
                     "fix the job's environment until `python -c 'import torch'` works"), {}
    facts = dict(seen)
    if seen.get("available"):
        return Check("cuda", OK, f"torch {seen['torch']} sees {seen['devices']} CUDA "
                     f"device(s), CUDA {seen['cuda_build']}, NCCL {seen.get('nccl') or '?'}",
                     facts=facts), facts
    if not seen.get("cuda_build"):
        return Check("cuda", SKIPPED, f"torch {seen['torch']} is a CPU build",
                     facts=facts), facts
    driver = any(os.path.exists(p) for p in DEVICE_FILES)
    return Check("cuda", PROBLEM if driver else SKIPPED,
                 f"torch {seen['torch']} (CUDA {seen['cuda_build']}) sees no CUDA device",
                 "check CUDA_VISIBLE_DEVICES and that the driver supports this CUDA "
                 "(nvidia-smi)" if driver else "", facts), facts
