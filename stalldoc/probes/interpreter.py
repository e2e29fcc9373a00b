"""Which Python interpreter, with which flags and environment, a command will run: the one the
doctor's children start, as ``watch`` would start the job, and whose installed packages the
launch checks read (``command_env.py``).

``python [flags] ...`` runs that interpreter; a console script (torchrun, deepspeed, accelerate,
swift, ray) runs the interpreter of its ``#!`` line; ``env [-i] [VAR=VALUE]... CMD``, ``srun``,
``mpirun``, ``taskset``, ``nohup``, ``timeout`` and other launchers run the first argument that is
one of those. A shell script runs a python the doctor cannot know before it runs; its lines that
replace PYTHONPATH or start python with ``-I`` / ``-E`` / ``-S`` are told.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from stalldoc.probes.agent_absence import BLIND_FLAGS, blind_flags, interpreter_flags

# programs that run their command on this node in the environment they change (env -i ...):
# the doctor's children run under them too
LOCAL_WRAPPERS = frozenset({"env", "taskset", "numactl", "nice", "nohup", "timeout", "stdbuf",
                            "chrt", "ionice", "setsid", "time"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_RESET = re.compile(r"\bPYTHONPATH=(?![^\s;]*\$\{?PYTHONPATH\b)")
_BLIND_CALL = re.compile(r"\bpython[0-9.]*\s+(-[A-Za-z]*[IES][A-Za-z]*)\b")


@dataclass(frozen=True)
class Target:
    """The interpreter a command runs (``python``: its argv prefix, flags included), how that
    was found, the environment it gets, and a shell wrapper's lines that keep the agent out."""

    python: tuple[str, ...]
    how: str
    env: Mapping[str, str] = field(default_factory=dict)
    wrapper: str = ""                       # the shell script the python comes from, if any
    wrapper_lines: tuple[str, ...] = ()     # its lines that reset PYTHONPATH or blind python
    error: str = ""                         # the command cannot run at all (not found...)
    prefix: tuple[str, ...] = ()            # local wrappers it runs under (env -i, taskset...)

    @property
    def argv(self) -> tuple[str, ...]:
        """How the doctor's children start: under the command's local wrappers, if any."""
        return (*self.prefix, *self.python)

    @property
    def blind_flags(self) -> tuple[str, ...]:
        """The interpreter's flags that keep the agent out."""
        return tuple(blind_flags(list(self.python[1:])))


def resolve(command: Sequence[str], environ: Mapping[str, str] | None = None) -> Target:
    """The Target of ``command`` (empty: stalldoc's own interpreter)."""
    env = dict(os.environ if environ is None else environ)
    if not command:
        return Target((sys.executable,), "stalldoc's own interpreter (no command given)", env)
    args, seen_env, index = list(command), env, 0
    while index < len(args):
        found = _program(args[index], seen_env)
        if found is None and index == 0:
            return Target((), "", env, error=f"{args[0]}: command not found")
        if found is not None and os.path.basename(found) == "env":
            seen_env, index = _env_effect(args, index + 1, seen_env)
            continue
        target = _target_of(found, args[index:], env, args[0] if index else "") \
            if found is not None else None
        if target is not None:
            local = os.path.basename(args[0]) in LOCAL_WRAPPERS
            return replace(target, prefix=tuple(args[:index]) if local else ())
        index += 1
    return Target(_path_python(env), "the python on PATH (no Python found in the command)",
                  env)


def _env_effect(args: list[str], index: int, env: Mapping[str, str]
                ) -> tuple[dict[str, str], int]:
    """The environment ``env`` (its options and assignments from ``args[index]`` on) gives its
    command, for finding that command on PATH; and where that command starts."""
    out = dict(env)
    while index < len(args):
        arg = args[index]
        if arg in ("-i", "--ignore-environment", "-"):
            out = {}
        elif arg in ("-u", "--unset", "-C", "--chdir") and index + 1 < len(args):
            if arg in ("-u", "--unset"):
                out.pop(args[index + 1], None)
            index += 1
        elif "=" in arg and not arg.startswith("-"):
            name, _, value = arg.partition("=")
            out[name] = value
        elif not arg.startswith("-"):
            break
        index += 1
    return out, index


def _program(arg: str, env: Mapping[str, str]) -> str | None:
    if os.sep in arg:
        return arg if os.path.isfile(arg) else None
    return shutil.which(arg, path=env.get("PATH", os.defpath))


def _target_of(program: str, args: list[str], env: dict[str, str], launcher: str
               ) -> Target | None:
    """The Target when ``program`` (run with ``args``) is a python, a script of one, or a
    shell script; None otherwise (a launcher: its arguments are read on)."""
    name = os.path.basename(program)
    by = f" (started by {os.path.basename(launcher)})" if launcher else ""
    if _PYTHON.match(name):
        return Target((program, *interpreter_flags(args[1:])), f"the command's interpreter{by}",
                      env)
    if name in SHELLS:
        script = next((a for a in args[1:] if not a.startswith("-")), "")
        return _wrapper(script, env) if script and os.path.isfile(script) else None
    shebang = _shebang(program)
    if not shebang:
        return None
    interpreter = _shebang_program(shebang, env)
    base = os.path.basename(interpreter[0]) if interpreter else ""
    if _PYTHON.match(base):
        return Target(tuple(interpreter), f"the interpreter of {name}'s #! line{by}", env)
    if base in SHELLS:
        return _wrapper(program, env)
    return None


def _shebang(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return ""
    return first[2:].decode("utf-8", "replace").strip() if first.startswith(b"#!") else ""


def _shebang_program(line: str, env: Mapping[str, str]) -> list[str]:
    """A ``#!`` line as argv: ``/usr/bin/env [-S] python3 -u`` resolved through PATH."""
    words = line.split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if w != "-S"]
        if words:
            found = shutil.which(words[0], path=env.get("PATH", os.defpath))
            words[0] = found or words[0]
    return words


def _wrapper(script: str, env: dict[str, str]) -> Target:
    """A shell script: its python is only known when it runs; the python on PATH stands in,
    and its lines that keep the agent out are told."""
    try:
        with open(script, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        text = ""
    lines = tuple(line.strip() for line in text.splitlines()
                  if not line.strip().startswith("#")
                  and (_RESET.search(line) or _BLIND_CALL.search(line)
                       or re.search(r"\benv\s+-i\b", line)))
    return Target(_path_python(env), f"the python on PATH ({os.path.basename(script)} is a "
                  "shell script: which python it runs is only known when it runs)", env,
                  script, lines)


def _path_python(env: Mapping[str, str]) -> tuple[str, ...]:
    path = env.get("PATH", os.defpath)
    found = shutil.which("python3", path=path) or shutil.which("python", path=path)
    return (found or sys.executable,)
