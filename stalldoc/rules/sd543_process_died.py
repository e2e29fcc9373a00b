"""SD543 process-died."""
from __future__ import annotations

import re
from typing import Any, Mapping

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind
from stalldoc.rules.log_signature import LINE_START

_NOT_ZERO = r"(?!0\b)-?\d+"
_TORCHRUN = rf"\bfailed \(exitcode: {_NOT_ZERO}\) local_rank: \d+ \(pid: \d+\)"
_ELASTIC_SUMMARY = rf"\bexitcode\s*: {_NOT_ZERO} \(pid: \d+\)"
_ELASTIC_SIGNAL = r"\bSignal \d+ \(SIG[A-Z]+\) received by PID \d+"
_DEEPSPEED = rf"\bexits with return code = {_NOT_ZERO}"
_DATALOADER = (r"\bDataLoader worker \(pid(?:\(s\))? [\d, ]+\) (?:is killed by signal|exited "
               r"unexpectedly)")
_BUS_WORKER = r"\bUnexpected bus error encountered in worker"
# SIGINT is the user's Ctrl-C, which the launcher passes on: no process died of its own
_ELASTIC_AGENT = (r"\bReceived (?:Signals\.)?(?!2 |SIGINT )\w+ death signal, shutting down "
                  r"workers", r"\bProcess \d+ got signal: (?!2\b)\d+")
_SPAWN = r"\bprocess \d+ terminated with (?:signal SIG[A-Z]+|exit code -?\d+)"
_SUBPROCESS = (r"\bdied with <Signals\.SIG[A-Z]+: \d+>", r"\breturned non-zero exit status \d+")
_MPIRUN = (r"\bprocess rank \d+ with PID \d+ on node (?:\S+ )?exited on signal \d+",
           r"\bPrimary job +terminated normally, but \d+ process(?:es)? returned")
_SRUN = (r"\bsrun: error: \S+: tasks? [\d,-]+: (?:Killed|Exited with exit code \d+"
         r"|[A-Z][A-Za-z ]+)$", r"\bsrun: Force Terminated (?:job step|StepId=)",
         r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+")
_SHELL = (r"\bline \d+: +\d+ (?:Killed|Segmentation fault|Aborted|Bus error)\b",
          r"(?:Segmentation fault|Bus error|Aborted|Illegal instruction) \(core dumped\)",
          LINE_START + r"Killed$", LINE_START + r"已杀死$",
          r"\(interrupted by signal \d+: ?SIG[A-Z]+\)")
_FATAL = (r"\bFatal Python error: (?:Segmentation fault|Bus error|Aborted|Floating point "
          r"exception)", r"\*\*\* SIG[A-Z]+ \(@0x[0-9a-f]+\) received by PID \d+")
_RAY = (r"\bRayTaskError\((?:ActorDiedError|WorkerCrashedError)\)",)
_SAID_BY = {"torchrun": (_TORCHRUN, _ELASTIC_SUMMARY, _ELASTIC_SIGNAL, *_ELASTIC_AGENT),
            "the DeepSpeed launcher": (_DEEPSPEED,),
            "a DataLoader worker": (_DATALOADER, _BUS_WORKER),
            "torch.multiprocessing": (_SPAWN,), "a launcher's subprocess": _SUBPROCESS,
            "mpirun": _MPIRUN, "srun": _SRUN, "the shell": _SHELL, "Python": _FATAL, "Ray": _RAY}
_BY_SIGNAL = {
    "SIGKILL": "Killed from outside (SIGKILL): most often the kernel's or the container's OOM "
               "killer (`dmesg | grep -i oom`, the pod's OOMKilled), else the scheduler or a "
               "monitor; give the job the memory it needs or lower its use (DataLoader workers, "
               "CPU offload).",
    "SIGBUS": "A bus error: most often shared memory ran out (DataLoader workers pass tensors "
              "through /dev/shm): give the container more (`--shm-size`, `--ipc=host`) or use "
              "fewer workers.",
    "SIGSEGV": "A native crash (SIGSEGV) in an extension or a library: the lines before it (or "
               "`PYTHONFAULTHANDLER=1`) name the frame; check the versions of the compiled "
               "extensions against torch and CUDA.",
    "SIGABRT": "Aborted (SIGABRT): a C++ check failed or the NCCL watchdog took the process "
               "down; the error printed just before it is the cause, often another rank's.",
    "SIGHUP": "The launcher's terminal went away (SIGHUP): a job started from an ssh session "
              "dies with it; start it under `nohup`, `tmux`/`screen`, or the scheduler.",
    "SIGTERM": "Stopped from outside (SIGTERM): the launcher after another rank failed (find "
               "that rank's first error), the scheduler's time limit or a preemption.",
}


class ProcessDied(LogKind):
    """A process died by a signal or with an exit code, in any launcher's words.

    What it does
        Matches how launchers and frameworks report a dead process: torchrun's ``failed
        (exitcode: -9) local_rank: 3 (pid: N)`` and its summary's ``exitcode : -6 (pid: N)``,
        elastic's ``Signal 11 (SIGSEGV) received by PID N``, the DeepSpeed launcher's ``Process
        N exits with return code = -9``, ``DataLoader worker (pid N) is killed by signal:
        Killed.``, torch.multiprocessing's ``process 1 terminated with signal SIGKILL``,
        accelerate's ``died with <Signals.SIGKILL: 9>``, mpirun's and srun's reports, the
        shell's ``Killed`` and ``Segmentation fault (core dumped)``, ``Fatal Python error``.
        A launcher's own ``closing signal SIGTERM`` to the survivors is no death of its own,
        nor a launcher's ``Received 2 death signal``: the user's Ctrl-C, passed on.

    Why is this bad?
        One dead process ends the job, or (a DataLoader worker, a rollout worker) leaves the
        rank that waits on it, and then every peer, waiting. The launcher's line is often the
        only trace: a process killed by SIGKILL prints nothing itself.

    Evidence
        the lines; ``what`` (the launcher or framework that spoke), the parts the lines carry:
        ``pid``, ``local_rank``, ``rank``, ``exit_code``, ``signal``, ``host``; the ranks that
        printed them.

    Fix
        Find why it died from how: SIGKILL (-9) from outside is most often the OOM killer
        (`dmesg | grep -i oom`); SIGBUS in a DataLoader worker is shared memory (`--shm-size`);
        SIGSEGV or SIGABRT is a native crash or a check, printed just before; an exit code is
        the rank's own Python traceback, above this line.

    References
        tatsu-lab/stanford_alpaca#202 (torchrun fine-tune with DeepSpeed ZeRO: local rank 1 killed
        with signal 9 right after the ZeRO partitioning); hpcaitech/ColossalAI#3514
        (ColossalAI-Chat training on 4 GPUs: local rank 3 SIGKILLed and the other three ranks get
        SIGTERM from torchrun); meta-llama/llama#856 (llama-2-7b chat example under torchrun on a
        laptop: the single worker is SIGKILLed while loading the checkpoint); AkariAsai/self-rag#83
        (self-rag training killed with signal 9; the reporter found host memory was not enough);
        hezhangsprinter/DCPDN#12 (training script's DataLoader worker killed (SIGKILL) on a 16 GB
        host; setting workers to 0 worked around it); MhLiao/DB#94 (DBNet training: a DataLoader
        worker dies of a segmentation fault though memory is sufficient); sangrockEG/S2C#8 (a
        preprocessing script crashes with SIGSEGV (exit code 139) at 1% of its progress bar);
        deepspeedai/DeepSpeed#3232 (DeepSpeed-Chat step 1 (opt-125m, ZeRO-2) on Colab: the training
        process is SIGKILLed and the DeepSpeed launcher reports return code -9);
        deepspeedai/DeepSpeed#5302 (ZeRO-3 SFT run under the deepspeed launcher: after saving one
        checkpoint a worker exits with code 1 and the launcher kills the rest); horovod/horovod#469
        (8-GPU Horovod/Keras job under mpirun: rank 7 is killed with signal 9 at the first epoch
        with no Python error); horovod/horovod#926 (Horovod job on a Celeron CPU without AVX: rank
        0 dies of SIGILL under mpirun); PaddlePaddle/Paddle#13288 (large multi-node Paddle MPI job:
        rank 140 on one node killed with signal 9; maintainers say a node failed at random);
        lyu-yx/ACUMEN#4 (2-GPU mp.spawn training: spawned process 0 is SIGKILLed and the parent
        raises ProcessExitedException); jeffffffli/HybrIK#198 (HybrIK mp.spawn training (older
        torch): worker process 3 SIGKILLed at the start of epoch 0); ArjunaCluster/ArjunaUsers#48
        (GPU job on a Slurm cluster killed after ~30 min, suspected cgroup memory limit);
        coqui-ai/STT#2238 (Slurm cancels the training job after it exceeded its memory limit);
        threestudio-project/threestudio#369 (threestudio (Lightning) training segfaults mid-epoch;
        faulthandler's message is glued to the progress bar); PeterGriffinJin/Search-R1#45
        (Search-R1 PPO driver task fails because a worker actor died); ymirsky/VulChecker#8
        (VulChecker's training demo script: bash reports the feature_stats step Killed (VM out of
        memory)); danijar/dreamerv3#203 (DreamerV3 training killed by the OOM killer as the replay
        buffer grows; the shell prints 'Killed' in a Chinese locale); weiliu89/caffe#689 (SSD caffe
        training aborts (SIGABRT, glog stack trace) after std::bad_alloc in the LMDB data reader
        thread); santi-pdp/segan#40 (SEGAN inference script: bash reports the python process
        Aborted after std::bad_alloc); bmaltais/kohya_ss#2556 (SDXL LoRA training via accelerate on
        Windows: the child python dies mid-epoch with 0xC0000005 (access violation) and accelerate
        raises CalledProcessError); kohya-ss/sd-scripts#1354 (SDXL dreambooth training launched by
        accelerate: the training process exits with status 1); determined-ai/determined#8915
        (Determined's distributed MNIST tutorial: the torchrun agent receives SIGTERM and shuts
        down its workers after runtime errors and a hang); PrimeIntellect-ai/prime-rl#1360
        (prime-rl trainer's torchrun agent gets SIGTERM because the orchestrator or inference
        server crashed); OpenMOSS/MOSS#237 (MOSS fine-tune started under nohup: the torchrun agent
        gets SIGHUP and shuts the workers down); OpenBMB/MiniCPM-V#312 (MiniCPM-V fine-tune under
        torchrun: local rank 2 is SIGKILLed while loading checkpoint shards (14%), the others get
        SIGTERM); GSavathrakis/ShipRS_H2OBB#3 (image segmentation preprocessing killed at 3% (bash
        prints Killed)); hezhangsprinter/DCPDN#58 (DCPDN training: a DataLoader worker dies of a
        bus error because /dev/shm is too small); buppt/ChineseNRE#41 (ChineseNRE train.py on
        Windows: two DataLoader workers exit unexpectedly; num_workers=0 avoids it);
        xuebinqin/BASNet#32 (BASNet test script on Windows: its DataLoader worker exits
        unexpectedly); NVIDIA/Megatron-LM#1880 (Megatron-LM llama3-8B FP8 pretraining: rank 0
        segfaults and torchrun's failure summary reports SIGSEGV (exitcode -11));
        fudan-generative-vision/hallo2#56 (hallo2 stage-1 training on 8x3090 via
        accelerate/deepspeed: local rank 1 segfaults at step 0 and the others get SIGTERM);
        FedML-AI/FedML#588 (FedML cross-silo MPI FedAvg example: rank 0 segfaults under mpirun).
    """

    code = "SD543"
    name = "process-died"
    kind = "process_died"
    severity = Severity.ERROR
    headline = "a process died"
    wordings = _SAID_BY

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        found = super().details(match)
        if match.re.pattern == _BUS_WORKER:
            found.setdefault("signal", "SIGBUS")
        return found

    def fix_for(self, evidence: Mapping[str, Any]) -> str | None:
        return _BY_SIGNAL.get(str(evidence.get("signal")))
