"""The launch configuration: what the watched command line and its environment say about the job.

Recognises ``swift <sub-command> ...``, torchrun / ``python -m torch.distributed.run``,
``deepspeed``, ``accelerate launch`` and plain ``python``, finds the training program below the
launcher, and reads its ``--flag value`` arguments. swift 3.x argument names are mapped to their
4.x names, so rules ask for one name. The numbers the plan and the rules use are checked
(launch/arguments.py) and the files named are read without blocking and with a size cap
(launch/files.py): what cannot be used is said in ``LaunchConfig.error``, one line, never raised.
A rule that needs a number and finds none stays quiet; one whose number is out of range gets a
BadArgument from ``number(config, name)``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from stalldoc.errors import one_line
from stalldoc.launch.arguments import (NNODES, NPROC_PER_NODE, SWIFT_NUMBERS,
                                       TORCHRUN_NPROC_WORDS, BadArgument, NumberSpec, checked,
                                       swift_number, swift_problems)
from stalldoc.launch.files import read_text, reason, shape
from stalldoc.model.launch import LaunchConfig as LaunchConfig

# swift 3.x name -> 4.x name (../shared/notes/swift.md)
SWIFT_RENAMES = {"tensor_parallel_size": "vllm_tensor_parallel_size", "train_type": "tuner_type"}
ENV_KEYS = ("NPROC_PER_NODE", "NNODES", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
            "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT")
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_SWIFT_MODULE = "swift.cli."
_NPROC_FLAGS = {"--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus",
                "--num_processes", "--num-processes"}
_NNODES_FLAGS = {"--nnodes", "--num_nodes", "--num-nodes", "--num_machines", "--num-machines"}
_CONFIG_VALUES_MAX = 100_000     # values in a swift config file, aliases counted at each use
_CONFIG_DEPTH_MAX = 64           # nesting of a swift config file's values


def number(config: LaunchConfig, name: str) -> int | float | None:
    """The value of a numeric argument; None when not given. A swift argument the plan and
    rules use (arguments.SWIFT_NUMBERS) out of its range raises BadArgument (one line);
    any other name that is not a finite number is None."""
    if name in SWIFT_NUMBERS:
        return swift_number(name, config.args[name]) if name in config.args else None
    value = config.value(name)
    try:
        found = float(value) if value is not None else None
    except ValueError:
        return None
    return found if found is not None and math.isfinite(found) else None


def deepspeed_of(config: LaunchConfig) -> DeepSpeedChoice | None:
    """The DeepSpeed choice: a swift preset (zero2, zero3, zero3_offload) or a JSON file."""
    value = config.value("deepspeed")
    return deepspeed_choice(value) if value else None


@dataclass(frozen=True)
class DeepSpeedChoice:
    name: str                 # the preset or the file path as given
    stage: int | None         # ZeRO stage
    offload_param: bool       # parameters offloaded to CPU / NVMe
    offload_optimizer: bool   # optimizer state offloaded to CPU / NVMe
    error: str = ""           # why a JSON file could not be read


def deepspeed_choice(value: str) -> DeepSpeedChoice:
    """A swift preset by name, or the ``zero_optimization`` of a DeepSpeed JSON file (read
    without blocking, at most files.CONFIG_LIMIT bytes); never raises."""
    preset = re.fullmatch(r"zero([0-3])(_offload)?", value)
    if preset:
        offload = bool(preset.group(2))
        return DeepSpeedChoice(value, int(preset.group(1)), offload and preset.group(1) == "3",
                               offload)
    try:
        return _deepspeed_json(value, json.loads(read_text(value)))
    except (OSError, ValueError, RecursionError) as exc:
        return DeepSpeedChoice(value, None, False, False,
                               one_line(f"cannot read {value}: {reason(exc)}"))


def _deepspeed_json(name: str, doc: Any) -> DeepSpeedChoice:
    """The ZeRO stage and offload devices of a DeepSpeed JSON document; ValueError for a shape
    DeepSpeed would refuse."""
    if not isinstance(doc, dict):
        raise ValueError(f"the top level is {shape(doc)}, not an object")
    zero = doc.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise ValueError(f"zero_optimization is {shape(zero)}, not an object")
    stage = zero.get("stage")
    if stage is not None and (isinstance(stage, bool) or str(stage) not in ("0", "1", "2", "3")):
        raise ValueError(f"zero_optimization.stage is {json.dumps(stage)[:40]}, not 0, 1, 2 or 3")
    devices: dict[str, str] = {}
    for key in ("offload_param", "offload_optimizer"):
        offload = zero.get(key) or {}
        if not isinstance(offload, dict):
            raise ValueError(f"zero_optimization.{key} is {shape(offload)}, not an object")
        devices[key] = str(offload.get("device", "none")).lower()
    return DeepSpeedChoice(name, None if stage is None else int(stage),
                           devices["offload_param"] in ("cpu", "nvme"),
                           devices["offload_optimizer"] in ("cpu", "nvme"))


def _load_config_file(path: str) -> Any:
    text = read_text(path)
    if path.endswith(".json"):
        return json.loads(text)
    try:
        import yaml  # swift depends on PyYAML; stalldoc itself does not
    except ImportError as exc:
        raise ValueError("PyYAML is not installed") from exc
    try:  # swift's safe_load; never libyaml's C loader, whose recursion overflows the C stack
        return yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"not valid YAML: {exc.problem or exc.context}{where}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None


def _check_size(value: Any) -> None:
    """ValueError when a config file's values are nested too deep or too many (YAML aliases
    counted at every use, so an alias bomb or a cycle is refused before it is expanded)."""
    stack, seen = [(value, 0)], 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > _CONFIG_VALUES_MAX or depth > _CONFIG_DEPTH_MAX:
            raise ValueError(f"more than {_CONFIG_VALUES_MAX} values or nested deeper than "
                             f"{_CONFIG_DEPTH_MAX} levels")
        if isinstance(item, dict):
            stack += [(v, depth + 1) for pair in item.items() for v in pair]
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack += [(v, depth + 1) for v in item]


def _config_flags(config: Any) -> tuple[list[str], dict[str, str]]:
    """swift's ``parse_yaml_args``: keys as flags (lists as several values, dicts as JSON), the
    ``ENV`` mapping as environment variables; ValueError for a shape swift cannot use."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError(f"the top level is {shape(config)}, not a mapping of argument names")
    _check_size(config)
    config = dict(config)
    env = config.pop("ENV", None) or {}
    if not isinstance(env, dict):
        raise ValueError(f"ENV is {shape(env)}, not a mapping of variable names to values")
    flags: list[str] = []
    for key, value in config.items():
        flags.append(f"--{key}")
        if isinstance(value, list):
            flags += [str(v) for v in value]
        else:
            flags.append(json.dumps(value, ensure_ascii=False) if isinstance(value, dict)
                         else str(value))
    return flags, {str(k): str(v) for k, v in env.items()}


def expand_config_file(argv: Sequence[str]) -> tuple[list[str], dict[str, str], str]:
    """swift's config-file form, ``swift rlhf config.yaml [--more flags]``: the file's keys become
    flags (lists as several values, dicts as JSON) and its ``ENV`` block environment variables.
    Returns (argv, environment from the file, why the file could not be read). Never raises,
    never blocks on a FIFO or a device, reads at most files.CONFIG_LIMIT bytes."""
    argv = list(argv)
    if not argv or not argv[0].endswith((".json", ".yaml", ".yml")):
        return argv, {}, ""
    try:
        flags, env = _config_flags(_load_config_file(argv[0]))
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        return argv[1:], {}, f"cannot read {argv[0]}: {reason(exc)}"
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


@dataclass(frozen=True)
class _Count:
    """Where the processes per node or the nodes come from: an environment variable or a
    launcher's flag (``strict``: the launcher reads it, so a word that is not a number is bad)."""

    label: str
    text: str | None
    strict: bool

    def read(self, spec: NumberSpec) -> tuple[int | None, str]:
        """(the number, "") when usable; (None, why) when out of range, or not a number and
        strict; (None, "") when not given, torchrun's auto / cpu / gpu / xpu, or a word nobody
        reads."""
        text = self.text
        if text is None or text.strip().lower() in TORCHRUN_NPROC_WORDS:
            return None, ""
        if not self.strict and not text.strip().lstrip("+-").isdigit():
            return None, ""
        try:
            return int(checked(self.label, text, spec)), ""
        except BadArgument as exc:
            return None, str(exc)


def _env_count(env: Mapping[str, str], key: str, strict: bool) -> _Count:
    return _Count(key, env.get(key), strict)


def _flag_count(opts: Mapping[str, str], flags: set[str], fallback: _Count) -> _Count:
    return next((_Count(k, v, True) for k, v in opts.items() if k in flags), fallback)


_LAUNCHERS = ("torchrun", "deepspeed", "accelerate")


def launcher_options(argv: Sequence[str]) -> dict[str, str]:
    """The options given to torchrun (also as ``python -m torch.distributed.run``), deepspeed or
    ``accelerate launch`` before the program; {} for any other command."""
    name, rest = _launcher(argv)
    return _split_launcher(rest)[0] if name in _LAUNCHERS else {}


def _launcher(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(launcher, the arguments after it). The launcher is torchrun (also ``python -m
    torch.distributed.run``), deepspeed or accelerate (``accelerate launch``: the arguments after
    ``launch``); "python" for another Python command line (the arguments after the interpreter's
    own -u / -O / -B); "" for anything else (the arguments after the command)."""
    name = os.path.basename(argv[0]) if argv else ""
    rest = list(argv[1:])
    if name.startswith("python"):
        while rest and rest[0] in ("-u", "-O", "-B"):
            rest = rest[1:]
        if len(rest) > 1 and rest[0] == "-m" and rest[1] in _TORCHRUN_MODULES:
            return "torchrun", rest[2:]
        return "python", rest
    if name in ("torchrun", "deepspeed"):
        return name, rest
    if name == "accelerate" and rest[:1] == ["launch"]:
        return name, rest[1:]
    return "", rest


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
    """What the watched command is; never raises. What cannot be read or used (a config file,
    a DeepSpeed JSON, a number out of range) is said in ``error``, one line."""
    config, nproc, nnodes, file_error = _read_command(list(argv), env)
    nproc_per_node, nproc_error = nproc.read(NPROC_PER_NODE)
    nodes, nnodes_error = nnodes.read(NNODES)
    problems = [file_error, nproc_error, nnodes_error]
    if config.swift_command is not None:       # swift reads these numbers and this file
        choice = deepspeed_of(config)
        problems += [*swift_problems(config.args), choice.error if choice else ""]
    return dataclasses.replace(config, nproc_per_node=nproc_per_node, nnodes=nodes,
                               error="; ".join(p for p in problems if p))


def _read_command(argv: list[str], env: Mapping[str, str]) -> tuple[LaunchConfig, _Count,
                                                                     _Count, str]:
    """The command's launcher, program and arguments; where its processes per node and nodes
    come from; why its swift config file could not be read."""
    name = os.path.basename(argv[0]) if argv else ""
    kept = {k: env[k] for k in ENV_KEYS if k in env}
    nproc, nnodes = _env_count(env, "NPROC_PER_NODE", False), _env_count(env, "NNODES", False)
    if name == "swift":
        sub = argv[1] if len(argv) > 1 else None
        args, file_env, error = expand_config_file(argv[2:])
        for key, value in file_env.items():  # swift: the environment wins over the file's ENV
            if key in ENV_KEYS and key not in env:
                kept[key] = value
        return (LaunchConfig("swift", "swift", sub, parse_flags(args), kept),
                _env_count(kept, "NPROC_PER_NODE", True), _env_count(kept, "NNODES", True), error)
    launcher, rest = _launcher(argv)
    if launcher == "python":
        program, sub, args = _program(rest)
        return LaunchConfig("python", program, sub, parse_flags(args), kept), nproc, nnodes, ""
    if launcher in _LAUNCHERS:
        opts, prog = _split_launcher(rest)
        program, sub, args = _program(prog)
        return (LaunchConfig(launcher, program, sub, parse_flags(args), kept),
                _flag_count(opts, _NPROC_FLAGS, nproc), _flag_count(opts, _NNODES_FLAGS, nnodes),
                "")
    return (LaunchConfig("other", argv[0] if argv else "", None, parse_flags(rest), kept), nproc,
            nnodes, "")
