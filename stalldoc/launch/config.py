"""The launch configuration: what the watched command line and its environment say about the job.

Recognises ``swift <sub-command> ...``, torchrun / ``python -m torch.distributed.run``,
``deepspeed``, ``accelerate launch`` and plain ``python``, finds the training program below the
launcher, and reads its ``--flag value`` arguments. swift 3.x argument names are mapped to their
4.x names, so rules ask for one name. Nothing is validated here: a rule that needs a number and
finds none stays quiet.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

# swift 3.x name -> 4.x name (../shared/notes/swift.md)
SWIFT_RENAMES = {"tensor_parallel_size": "vllm_tensor_parallel_size", "train_type": "tuner_type"}
ENV_KEYS = ("NPROC_PER_NODE", "NNODES", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
            "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT")
_TRUE = {"true", "1", "yes", "on"}
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_SWIFT_MODULE = "swift.cli."
_NPROC_FLAGS = {"--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus",
                "--num_processes", "--num-processes"}
_NNODES_FLAGS = {"--nnodes", "--num_nodes", "--num-nodes", "--num_machines", "--num-machines"}


@dataclass(frozen=True)
class LaunchConfig:
    launcher: str               # swift / torchrun / deepspeed / accelerate / python / other
    program: str                                    # the training script or module
    swift_command: str | None                       # rlhf, sft, rollout, ... (None: not swift)
    args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: int | None = None
    nnodes: int | None = None
    error: str = ""                                 # why part of the command could not be read

    def value(self, name: str) -> str | None:
        values = self.args.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        """A boolean flag: given bare or with true/1/yes/on."""
        values = self.args.get(name)
        return values is not None and (not values or values[-1].lower() in _TRUE)

    def number(self, name: str) -> float | None:
        try:
            value = self.value(name)
            return float(value) if value is not None else None
        except ValueError:
            return None

    @property
    def is_grpo(self) -> bool:
        return self.swift_command == "rlhf" and (self.value("rlhf_type") or "") == "grpo"

    def deepspeed(self) -> DeepSpeedChoice | None:
        """The DeepSpeed choice: a swift preset (zero2, zero3, zero3_offload) or a JSON file."""
        value = self.value("deepspeed")
        return deepspeed_choice(value) if value else None

    @property
    def world_size(self) -> int | None:
        if self.nproc_per_node is None:
            return None
        return self.nproc_per_node * (self.nnodes or 1)


@dataclass(frozen=True)
class DeepSpeedChoice:
    name: str                 # the preset or the file path as given
    stage: int | None         # ZeRO stage
    offload_param: bool       # parameters offloaded to CPU / NVMe
    offload_optimizer: bool   # optimizer state offloaded to CPU / NVMe
    error: str = ""           # why a JSON file could not be read


def deepspeed_choice(value: str) -> DeepSpeedChoice:
    """A swift preset by name, or the ``zero_optimization`` of a DeepSpeed JSON file."""
    preset = re.fullmatch(r"zero([0-3])(_offload)?", value)
    if preset:
        offload = bool(preset.group(2))
        return DeepSpeedChoice(value, int(preset.group(1)), offload and preset.group(1) == "3",
                               offload)
    try:
        with open(value, encoding="utf-8") as fh:
            zero = json.load(fh).get("zero_optimization", {})
    except (OSError, ValueError, AttributeError) as exc:
        return DeepSpeedChoice(value, None, False, False, f"cannot read {value}: {exc}")
    devices = {key: (zero.get(key) or {}).get("device", "none") for key in
               ("offload_param", "offload_optimizer")}
    stage = zero.get("stage")
    return DeepSpeedChoice(value, stage if isinstance(stage, int) else None,
                           devices["offload_param"] in ("cpu", "nvme"),
                           devices["offload_optimizer"] in ("cpu", "nvme"))


def _load_config_file(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        if path.endswith(".json"):
            return json.load(fh)
        try:
            import yaml  # swift depends on PyYAML; stalldoc itself does not
        except ImportError as exc:
            raise ValueError("PyYAML is not installed") from exc
        return yaml.safe_load(fh) or {}


def expand_config_file(argv: Sequence[str]) -> tuple[list[str], dict[str, str], str]:
    """swift's config-file form, ``swift rlhf config.yaml [--more flags]``: the file's keys become
    flags (lists as several values, dicts as JSON) and its ``ENV`` block environment variables.
    Returns (argv, environment from the file, why the file could not be read)."""
    argv = list(argv)
    if not argv or not argv[0].endswith((".json", ".yaml", ".yml")):
        return argv, {}, ""
    try:
        config = dict(_load_config_file(argv[0]))
    except (OSError, ValueError, TypeError) as exc:
        return argv[1:], {}, f"cannot read {argv[0]}: {exc}"
    env = {str(k): str(v) for k, v in (config.pop("ENV", None) or {}).items()}
    flags: list[str] = []
    for key, value in config.items():
        flags.append(f"--{key}")
        if isinstance(value, list):
            flags += [str(v) for v in value]
        else:
            flags.append(json.dumps(value) if isinstance(value, dict) else str(value))
    return flags + argv[1:], env, ""


def parse_flags(argv: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--a 1 --b x y --c --d=2`` -> {a: (1,), b: (x, y), c: (), d: (2,)}, 3.x names mapped."""
    out: dict[str, tuple[str, ...]] = {}
    name: str | None = None
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg[2:].partition("=")
            name = SWIFT_RENAMES.get(key.replace("-", "_"), key.replace("-", "_"))
            out[name] = (value,) if eq else ()
            if eq:
                name = None
        elif name is not None:
            out[name] = out[name] + (arg,)
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _split_launcher(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """A launcher's own options up to the program, and the program's argv."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" or not arg.startswith("-"):
            return opts, list(argv[i:])
        key, eq, value = arg.partition("=")
        if eq:
            opts[key] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            opts[key] = argv[i + 1]
            i += 1
        else:
            opts[key] = ""
        i += 1
    return opts, []


def _program(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """(program, swift sub-command, its arguments) of ``script args`` or ``-m module args``."""
    if not argv:
        return "", None, []
    if argv[0] == "-m" and len(argv) > 1:
        module, rest = argv[1], argv[2:]
        sub = module[len(_SWIFT_MODULE):] if module.startswith(_SWIFT_MODULE) else None
        return module, sub, rest
    script, rest = argv[0], argv[1:]
    parts = script.replace(os.sep, "/").split("/")
    sub = parts[-1][:-3] if parts[-3:-1] == ["swift", "cli"] and script.endswith(".py") else None
    return script, sub, rest


def parse_command(argv: Sequence[str], env: Mapping[str, str]) -> LaunchConfig:
    """What the watched command is; never raises."""
    argv = list(argv)
    name = os.path.basename(argv[0]) if argv else ""
    kept = {k: env[k] for k in ENV_KEYS if k in env}
    nproc, nnodes = _int(env.get("NPROC_PER_NODE")), _int(env.get("NNODES"))
    if name == "swift":
        sub = argv[1] if len(argv) > 1 else None
        args, file_env, error = expand_config_file(argv[2:])
        for key, value in file_env.items():  # swift: the environment wins over the file's ENV
            if key in ENV_KEYS and key not in env:
                kept[key] = value
        nproc, nnodes = _int(kept.get("NPROC_PER_NODE")), _int(kept.get("NNODES"))
        return LaunchConfig("swift", "swift", sub, parse_flags(args), kept, nproc, nnodes, error)
    rest = argv[1:]
    if name.startswith("python"):
        while rest and rest[0] in ("-u", "-O", "-B"):
            rest = rest[1:]
        if len(rest) > 1 and rest[0] == "-m" and rest[1] in _TORCHRUN_MODULES:
            name, rest = "torchrun", rest[2:]
        else:
            program, sub, args = _program(rest)
            return LaunchConfig("python", program, sub, parse_flags(args), kept, nproc, nnodes)
    if name in ("torchrun", "deepspeed") or (name == "accelerate" and rest[:1] == ["launch"]):
        opts, prog = _split_launcher(rest[1:] if name == "accelerate" else rest)
        nproc = next((_int(v) for k, v in opts.items() if k in _NPROC_FLAGS), nproc)
        nnodes = next((_int(v) for k, v in opts.items() if k in _NNODES_FLAGS), nnodes)
        program, sub, args = _program(prog)
        return LaunchConfig(name, program, sub, parse_flags(args), kept, nproc, nnodes)
    return LaunchConfig("other", argv[0] if argv else "", None, parse_flags(rest), kept, nproc,
                        nnodes)
