"""SD544 filesystem-error."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind

_FULL = (r"No space left on device", r"Disk quota exceeded",
         r"\bPytorchStreamWriter failed writing file (?P<path>\S+): file write failed")
_STALE = (r"\bStale (?:NFS )?file handle",
          r"\[Errno 5\] (?P<error>Input/output error)")
_READ_ONLY = (r"\[Errno 30\] (?P<error>Read-only file system)",)
_LOCK = (r"\bThe file lock '(?P<path>[^']+)' could not be acquired",
         r"\[Errno 2\] No such file or directory: '(?P<path>[^']+\.lock)'",
         r"\bBlockingIOError: \[Errno 11\] (?P<error>Resource temporarily unavailable)",
         r"\[Errno 37\] (?P<error>No locks available)")
_RACE = (r"\[Errno 2\] No such file or directory: '(?P<path>[^']+)' -> '[^']+'",)
_WORDINGS = {"full": _FULL, "stale or failing storage": _STALE, "read-only": _READ_ONLY,
             "lock": _LOCK, "cache race": _RACE}
_FIXES = {
    "full": "The disk is full or over quota: free space where the job writes (checkpoints, "
            "caches, /tmp, /dev/shm), keep fewer checkpoints (`save_total_limit`), or point the "
            "writes at a larger volume.",
    "stale or failing storage": "A network filesystem lost a file under the job (a stale NFS "
                                "handle) or failed a read: keep what every rank writes and "
                                "reads at once (the Triton, Inductor, extension and datasets "
                                "caches) on each node's local disk (`TRITON_CACHE_DIR`, "
                                "`TORCHINDUCTOR_CACHE_DIR`, `HF_DATASETS_CACHE`).",
    "cache race": "A file vanished between its write and its rename: processes that share a "
                  "cache directory (Triton's, Inductor's, torch extensions') over a network "
                  "filesystem race on it. Give each node, or each rank, its own cache directory "
                  "(`TRITON_CACHE_DIR`, `TORCHINDUCTOR_CACHE_DIR`, `TORCH_EXTENSIONS_DIR`).",
    "read-only": "The job writes where it may not: set the output, cache and temporary "
                 "directories (`HF_HOME`, `TMPDIR`, the checkpoint dir) to a writable path.",
    "lock": "A lock file was not acquired or vanished: another process holds it (one still "
            "running, or one that died with it: remove the stale `.lock`), or ranks of several "
            "nodes share a cache over a network filesystem that does not lock: give each node "
            "its own cache directory.",
}


class FilesystemError(LogKind):
    """The filesystem failed the job: full, stale, read-only, or a lock not acquired or gone.

    What it does
        Matches the kind in any program's words: ``No space left on device``, ``Disk quota
        exceeded``, PyTorch's ``PytorchStreamWriter failed writing file``, ``Stale file handle``
        (``[Errno 116]``), ``[Errno 5] Input/output error``, ``[Errno 30] Read-only file
        system``, filelock's ``The file lock '...' could not be acquired``, a ``.lock`` file
        that vanished (``[Errno 2]``), ``flock``'s ``[Errno 11] Resource temporarily
        unavailable``.

    Why is this bad?
        A checkpoint save that fails on a full disk ends the run at its most expensive moment,
        or leaves a truncated checkpoint. Caches that every rank writes at once (Triton's,
        Inductor's, torch extensions', datasets') race on a network filesystem: one rank's file
        vanishes under another, or a rank waits on a lock another node's process holds, while
        its peers wait for it in a collective.

    Evidence
        the lines; ``what`` (full, stale or failing storage, read-only, lock), ``errno``,
        ``path``, ``error``; the ranks that printed them.

    Fix
        Free space or point the writes at a volume with room; keep caches that every rank
        writes on each node's local disk (`TRITON_CACHE_DIR`, `TORCHINDUCTOR_CACHE_DIR`,
        `HF_DATASETS_CACHE`); remove a lock file left by a process that died.

    References
        SWivid/F5-TTS#458 (A multi-GPU F5-TTS fine-tune fails while torch.save writes a checkpoint
        (file write failed)); rwth-i6/returnn#1829 (A single checkpoint-save write failed on a
        shared filesystem (Lustre/NFS error or quota bounce) and killed a multi-day training run);
        databrickslabs/dolly#139 (Training the 3B Dolly model ran out of disk while torch.save
        wrote a checkpoint); triton-lang/triton#2688 (In multi-process distributed training,
        processes race on a shared Triton cache and os.replace of the temp IR file fails);
        NOAA-EPIC/EAGLE#121 (The training step of an ML weather model dies in Triton's cache put
        (writing the compiled kernel) with a disk quota error on the cluster filesystem);
        huggingface/datasets#2618 (load_dataset hangs taking its cache file lock: fcntl.flock fails
        on the cache filesystem (no lock support) and the user has to interrupt);
        pytorch/torchdynamo#1185 (Inductor with DDP: processes race on the inductor code cache and
        os.rename of the temp file fails); tenstorrent/tt-metal#37051 (Multi-host CI on a shared
        drive: one host sees a stale NFS handle for the kernel cache and the pipeline hangs ([1,1]
        is mpirun's jobid,rank tag)); XiangLi1999/PrefixTuning#27 (train_e2e.py fails fetching the
        model config: the bundled transformers tries to create its cache dir under a read-only
        root); Comfy-Org/ComfyUI#5660 (snapshot_download of a Hub model fails: huggingface_hub
        cannot create the local dir on a read-only path); THUDM/slime#326 (Two-node Megatron
        training under slime: the second async distributed checkpoint save fails with EIO (the
        maintainer points at the filesystem's parallel-write support)); whwu95/Text4Vis#6 (Two-GPU
        training randomly fails reading frame folders of the dataset with EIO (different file each
        time)); Mikubill/naifu#35 (A multi-GPU diffusion training run dies on rank 3 when
        os.makedirs of the sampling dir hits EIO after ~13 hours); NVIDIA/NeMo-Aligner#502
        (NeMo-Aligner SFT fails while saving the last checkpoint (Lightning's ModelCheckpoint ->
        trainer.save_checkpoint) with EIO).
    """

    code = "SD544"
    name = "filesystem-error"
    kind = "filesystem"
    severity = Severity.ERROR
    headline = "a filesystem error"
    wordings = _WORDINGS
    fixes = _FIXES
