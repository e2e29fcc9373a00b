"""SD540 cuda-fault."""
from __future__ import annotations

import re
from typing import Any, Mapping

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind

_ERROR = r"\b(?:CUDA|HIP|CUDA driver) [Ee]rror: (?P<error>[A-Za-z][\w -]*[\w])"
_OLD_THC = r"\bcuda runtime error \(\d+\) : (?P<error>[A-Za-z][\w -]*[\w])"
_DRIVER = (r"\bCUDA_ERROR_(?!OUT_OF_MEMORY)[A-Z_]+", r"\bCUDA_EXCEPTION_\d+, ",
           r"\ban illegal memory access was encountered")
_ASSERTION = (r"\bblock: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `",
              r"\bDevice-side assertion `[^`]+` failed")
_NCCL_CUDA = r"Cuda failure (?:\d+ )?'(?P<error>[^']+)'"
_RUNTIME = (r"\bcudaError(?!Memory)[A-Z]\w+", r"\bhipError(?!OutOfMemory)[A-Z]\w+")
_LIBRARY = (r"\b(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_(?!ALLOC_FAILED|SUCCESS)[A-Z_]+")
_XID = r"\bNVRM: Xid \(PCI:[0-9a-fA-F:.]+\): \d+"
_HARDWARE = (r"fallen off the bus", r"uncorrectable ECC error encountered",
             r"Memory access fault by GPU node-\d+",
             r"\bNVRM: GPU [0-9a-fA-F:.]+: RmInitAdapter failed",
             r"\bNVRM: The NVIDIA probe routine failed",
             r"\bUnable to determine the device handle for GPU ?[0-9a-fA-F:.]+: Unknown Error")
_HARDWARE_WORDS = ("fallen off the bus", "ECC", "Memory access fault", "RmInitAdapter",
                   "probe routine failed", "device handle")
_XID_HARDWARE = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
_ASSERT = re.compile(r"device-side assert|Assertion `", re.I)


class CudaFault(LogKind):
    """A CUDA error or a GPU's hardware fault: a kernel that failed, or a device that did.

    What it does
        Matches the kind in any program's words: PyTorch's ``CUDA error: an illegal memory
        access was encountered`` (``unspecified launch failure``, ``misaligned address``,
        ``device-side assert triggered``, ``the launch timed out``), HIP's, NCCL's ``Cuda
        failure 'unspecified launch failure'``, the runtime's ``cudaErrorIllegalAddress``, the
        CUDA libraries' ``CUBLAS_STATUS_EXECUTION_FAILED``, the driver's ``NVRM: Xid (PCI:...):
        79``, ``GPU has fallen off the bus``, ``uncorrectable ECC error encountered``, ROCm's
        ``Memory access fault by GPU node-N``. Out of memory is SD539's.

    Why is this bad?
        A CUDA error poisons the process's context: every later call fails, often far from the
        kernel that failed, and the NCCL watchdog then takes the process down, so the log's last
        error (a collective timeout) hides the first. A device fault (an Xid, an ECC error, a
        GPU off the bus) ends every process on that GPU and comes back until the node is
        serviced.

    Evidence
        the lines; ``error`` (the error's words), ``xid`` and ``device`` (the driver's Xid and
        PCI address), the ranks that printed them.

    Fix
        Find the first error of the run, not the watchdog's timeout after it: run the failing
        step again with `CUDA_LAUNCH_BLOCKING=1` so the error is raised at the kernel that
        failed, and check the versions of the kernels' libraries (flash-attn, NCCL, the driver)
        against the CUDA that PyTorch was built with.

    References
        NVIDIA/semantic-segmentation#33 (8-GPU semantic-segmentation training dies after 18 epochs
        with an uncorrectable ECC error (hardware), old THC error format);
        nagadit/DeepFaceLab_Linux#89 (TensorFlow cannot create a CUDA context on a 4090 with an
        uncorrectable ECC error; moving to another machine fixed it); tloen/alpaca-lora#123
        (alpaca-lora fine-tune fails with an uncorrectable ECC error); kohya-ss/sd-scripts#1434
        (SDXL training on 2x H100: rank 1 hits an uncorrectable ECC error and the NCCL watchdog
        terminates); JuliaGPU/CUDAdrv.jl#106 (CUDAdrv tests on a Tesla K80 fail to create a
        context: uncorrectable ECC error (driver API code 214)); NVIDIA/NVSentinel#155 (dmesg on an
        on-prem GPU node: a GPU fell off the bus without an Xid line (message wrapped over three
        kernel lines)); Cyridd/cmpunlocker#4 (after a PCIe retrain the GPU falls off the bus (Xid
        79) and the driver cannot re-initialise it); ostris/ai-toolkit#470 (LoRA training on a
        RunPod RTX PRO 6000 fails with an uncorrectable ECC error (message pasted from the UI as
        one line)); daijifeng001/MNC#23 (MNC (caffe) test run aborts with a fatal glog check: CUDA
        error 77, illegal memory access); hao-ai-lab/FastVideo#1008 (FastVideo Wan-14B multi-node
        training: at step 382 the NCCL watchdog on rank 9 dies with an unspecified launch failure);
        deepseek-ai/DeepSeek-MoE#47 (DeepSeek-MoE fine-tune: rank 1's NCCL watchdog terminates on
        an unspecified launch failure); rwth-i6/returnn#1486 (RETURNN PyTorch training hangs;
        nvidia-smi can no longer reach the GPU and dmesg shows PCIe bus errors);
        NVIDIA/open-gpu-kernel-modules#1150 (a GPU on a node drops out at random; the kernel log
        shows Xid 45 channel teardown of python3 caused by a prior NVLink Xid 149);
        Bumblebee-Project/Bumblebee#677 (laptop GPU (later died) logs Xid 31 MMU faults and Xid 32
        errors in dmesg); NVIDIA/flowtron#52 (Flowtron training on Windows: embedding index out of
        range trips a CUDA device-side assert); efeslab/Nanoflow#23 (Nanoflow serving llama3-8B on
        an RTX 4090: attention prefill kernel launch fails with misaligned address (716));
        Dao-AILab/flash-attention#470 (flash-attention kernel on an A10 stops with a warp
        misaligned-address exception); hkust-vgd/pointwise#9 (TF segmentation training dies
        mid-epoch when a kernel exceeds the display watchdog limit (CUDA_ERROR_LAUNCH_TIMEOUT));
        Tessellate-Imaging/Monk_Object_Detection#90 (object-detection training prints the
        launch-timeout CUDA error over and over); aim-uofa/AdelaiDet#285 (ABCNet (detectron2)
        training aborts: c10::Error from the caching allocator after a CUDA launch timeout);
        facebookresearch/unbiased-teacher#80 (unbiased-teacher on 2x Tesla K80 stops after the
        first train/eval round with a launch timeout; other GPUs work); vlfeat/matconvnet#325
        (MatConvNet DAG training of vgg-f on a TITAN X fails with CUDA_ERROR_LAUNCH_FAILED);
        torch/cutorch#197 (DeepMind Atari DQN training in Lua torch crashes after ~300k steps with
        CUDA error 30; a maintainer suspects the driver or a bad/overheating GPU);
        nv-tlabs/3dgrut#191 (3DGRUT training aborts at 19% (step 5700) with a c10::Error: CUDA
        unknown error); NVIDIA/nvidia-docker#1553 (a GPU running a container falls off the bus (Xid
        79); the container then cannot be killed).
    """

    code = "SD540"
    name = "cuda-fault"
    kind = "cuda_fault"
    severity = Severity.ERROR
    headline = "a CUDA error"
    patterns = (_ERROR, _OLD_THC, _NCCL_CUDA, *_RUNTIME, _LIBRARY, *_DRIVER, *_ASSERTION, _XID,
                *_HARDWARE)

    def fix_for(self, evidence: Mapping[str, Any]) -> str | None:
        said = f"{evidence.get('error', '')} {evidence.get('last_line', '')}"
        if evidence.get("xid") in _XID_HARDWARE or any(w in said for w in _HARDWARE_WORDS):
            return ("The GPU itself failed: take the node out of the job, read `nvidia-smi -q` "
                    "(ECC errors, retired pages) and `dmesg` (the Xid), and reset or service the "
                    "GPU before it runs again; resume from the last checkpoint on healthy nodes.")
        if _ASSERT.search(said):
            return ("A kernel's own check failed, most often an index out of range: a label or "
                    "token id at or past the vocabulary or number of classes. Run with "
                    "`CUDA_LAUNCH_BLOCKING=1` (or the step on CPU) to see which operation.")
        return None
