"""What a process runs, read from its command line: the program (a Python module, a script or an
executable), and whether that program is a launcher (it starts ranks) or a runner (``conda
run``, ``poetry run``, ``wandb agent``: it starts the user's program and waits for it).

The program is told by its place on the command line, never by a word anywhere in it: ``python
train.py --deepspeed ds_zero3.json`` (the Hugging Face Trainer's flag) runs ``train.py``, not
DeepSpeed's launcher.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

# console scripts that start ranks (DeepSpeed installs ``ds`` beside ``deepspeed``)
LAUNCHER_NAMES = frozenset({"torchrun", "deepspeed", "ds", "accelerate", "accelerate-launch",
                            "swift", "ft_launcher"})   # ft_launcher: NVRx's torchrun
# modules run with ``python -m`` that start ranks, and the same files run as scripts
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher",
                    "accelerate.commands", "swift.cli.main",
                    "nvidia_resiliency_ext.fault_tolerance.launcher")
# console scripts that start ranks with some of their sub-commands: Lightning's ``fabric run``
# (and the older ``lightning run model``) runs torchrun inside its own process; TRL's training
# commands run ``accelerate launch`` inside theirs (``trl grpo``: one process on the CPU or one
# GPU, its program a child; ``trl vllm-serve`` is a program itself)
LAUNCHER_VERBS: dict[str, tuple[str, ...]] = {
    "fabric": ("run",), "lightning": ("run",),
    "trl": ("sft", "dpo", "grpo", "kto", "reward", "rloo")}
# console scripts that start the user's program and wait for it, with the sub-command that does
# (a W&B sweep's ``wandb agent`` runs the training program once per trial)
RUNNERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("conda", "mamba", "micromamba", "poetry", "pipenv", "hatch", "pdm", "rye",
                     "uv"), ("run",)), "wandb": ("agent",)}
_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})   # interpreter options
_RUN_WITHIN = 3      # ``conda --no-plugins run``: the sub-command among the first arguments


@dataclass(frozen=True)
class Program:
    """``kind`` is "module" (``python -m NAME``), "script" (``python NAME``), "code" (``python
    -c``), "python" (the interpreter alone) or "executable" (NAME is argv[0]); ``args`` follow."""
    kind: str
    name: str
    args: tuple[str, ...]


def program(cmdline: Sequence[str]) -> Program:
    """What ``cmdline`` runs: past the interpreter's own options when argv[0] is a Python."""
    if not cmdline:
        return Program("executable", "", ())
    if not os.path.basename(cmdline[0]).startswith("python"):
        return Program("executable", cmdline[0], tuple(cmdline[1:]))
    rest = list(cmdline[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-":
        option = rest.pop(0)
        if option in _WITH_VALUE:
            rest = rest[1:]
        elif not option.startswith("--") and option[1] not in "WX" and option[-1] in "mc":
            kind = "module" if option[-1] == "m" else "code"
            return Program(kind, rest[0] if rest else "", tuple(rest[1:]))
    return Program("script", rest[0], tuple(rest[1:])) if rest else Program("python", "", ())


def _module_of(path: str) -> str:
    """A script's path as the dotted module it is (``.../torch/distributed/run.py`` ->
    ``torch.distributed.run``), as far as its last parts go."""
    stem = path[:-3] if path.endswith(".py") else path
    return ".".join(stem.replace(os.sep, "/").split("/"))


def _runs_verb(prog: Program, verbs: dict[str, tuple[str, ...]]) -> bool:
    """``prog`` is a console script of ``verbs`` given one of its sub-commands (``conda run``)."""
    if prog.kind not in ("script", "executable"):
        return False
    wanted = verbs.get(os.path.basename(prog.name), ())
    return any(arg in wanted for arg in prog.args[:_RUN_WITHIN])


def is_launcher(cmdline: Sequence[str]) -> bool:
    """A launcher (torchrun, deepspeed, accelerate, swift, ``fabric run``, ``trl grpo``): it
    starts ranks, or the one process of a job that runs on one device."""
    prog = program(cmdline)
    if prog.kind in ("script", "executable") and os.path.basename(prog.name) in LAUNCHER_NAMES:
        return True
    if _runs_verb(prog, LAUNCHER_VERBS):
        return True
    dotted = prog.name if prog.kind == "module" else _module_of(prog.name)
    return prog.kind in ("module", "script") and any(f".{m}." in f".{dotted}."
                                                     for m in LAUNCHER_MODULES)


def is_runner(cmdline: Sequence[str]) -> bool:
    """A runner (``conda run``, ``poetry run``, ``uv run``, ``wandb agent``): it starts the
    user's program and waits for it."""
    return _runs_verb(program(cmdline), RUNNERS)
