"""Why a Python rank runs without stalldoc's agent, read from what the process is: its
interpreter's flags (``/proc/PID/cmdline``) and two variables of its environment
(``/proc/PID/environ``; no other value is kept).

The agent starts from the bootstrap ``sitecustomize`` on PYTHONPATH and writes where
STALLDOC_AGENT_DIR says. ``python -I`` ignores PYTHONPATH and skips site, ``-E`` ignores every
PYTHON* variable, ``-S`` skips site; ``env -i`` or a wrapper that sets its own PYTHONPATH takes
the variables away.
"""
from __future__ import annotations

import os

from stalldoc.agent.statefile import ENV_AGENT_DIR
from stalldoc.probes.proc_table import read_environment

# flags that make an interpreter ignore PYTHONPATH or skip site (so sitecustomize): no agent
BLIND_FLAGS = {"-I": "isolated mode (-I) ignores PYTHONPATH and skips the user's site",
               "-E": "-E ignores every PYTHON* variable, PYTHONPATH too",
               "-S": "-S skips the site module, so no sitecustomize runs"}
FLAGS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
_WANTED = (b"PYTHONPATH", ENV_AGENT_DIR.encode())


def is_python(pid: int, proc: str = "/proc") -> bool:
    """The process runs a Python interpreter (its executable's name: python3.11, pypy3...)."""
    try:
        exe = os.path.basename(os.readlink(f"{proc}/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith(("python", "pypy")) and exe.rstrip("0123456789.").isalpha()


def interpreter_flags(args: list[str]) -> list[str]:
    """The interpreter's own options in ``args`` (its argv after the program), up to the
    script, ``-m`` or ``-c``; a flag's value too."""
    flags: list[str] = []
    rest = iter(args)
    for arg in rest:
        if not arg.startswith("-") or arg in ("-", "-m", "-c") or arg.startswith(("-m", "-c")):
            break
        flags.append(arg)
        if arg in FLAGS_WITH_VALUE:
            flags.append(next(rest, ""))
    return flags


def blind_flags(flags: list[str]) -> list[str]:
    """Which of an interpreter's options (``interpreter_flags``) keep the agent out."""
    letters = "".join(f[1:] for f in flags
                      if f.startswith("-") and not f.startswith(("--", "-X", "-W")))
    return [flag for flag in BLIND_FLAGS if flag[1] in letters]


def why_no_agent(pid: int, bootstrap: str, proc: str = "/proc") -> str:
    """Why ``pid`` has no agent, as far as its command line and environment tell."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        argv = []
    flags = blind_flags(interpreter_flags(argv[1:]))
    if "-I" in flags:
        flags = ["-I"]   # it sets the other two
    if flags:
        return "; ".join(f"python {flag}: {BLIND_FLAGS[flag]}" for flag in flags)
    env = read_environment(pid, _WANTED, proc)
    if env is None:
        return "its command line and environment cannot be read (another user's process?)"
    if ENV_AGENT_DIR.encode() not in env:
        return (f"its environment has no {ENV_AGENT_DIR}: something between stalldoc and the "
                "rank replaced it (env -i, a wrapper or launcher that sets its own)")
    paths = env.get(b"PYTHONPATH", b"").decode("utf-8", "replace").split(os.pathsep)
    if os.path.normpath(bootstrap) not in {os.path.normpath(p) for p in paths if p}:
        return ("its PYTHONPATH does not hold stalldoc's bootstrap: a wrapper set its own "
                "(add to it: PYTHONPATH=...:$PYTHONPATH)")
    return "the agent did not start in it (see agent-errors.log in the run directory)"

