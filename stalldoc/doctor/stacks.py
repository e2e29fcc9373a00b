"""Can py-spy read the job's processes? A real child of the job's interpreter is read the way
``watch`` reads a rank; when it cannot be, why (ptrace scope, capabilities, a seccomp filter, a
container) and what ``watch`` does instead (faulthandler dumps through the agent)."""
from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from stalldoc.doctor.model import OK, PROBLEM, Check
from stalldoc.probes.interpreter import Target
from stalldoc.errors import PtraceDenied
from stalldoc.probes import ProbeUnavailable
from stalldoc.probes.pyspy import dump_pyspy, pyspy_binary

CAP_SYS_PTRACE = 19
START_TIMEOUT = 60.0   # seconds the child may take to start (a slow file system, a heavy site)
SLEEPER = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)\n"
_FALLBACK = ("watch falls back to faulthandler dumps through the agent (Python frames only); "
             "attach cannot read stacks at all")
_NO_STACKS = ("and the agent does not load either (see below): watch will have no stacks at "
              "all, nor attach")


class ChildFailed(RuntimeError):
    """The child to read did not run."""


def check_stacks(target: Target, agent_loads: bool = True) -> Check:
    """``agent_loads``: whether the agent check found the agent running in the command's python
    (the faulthandler fallback goes through it)."""
    facts = ptrace_facts()
    fallback = _FALLBACK if agent_loads else _NO_STACKS
    try:
        binary = pyspy_binary()
    except ProbeUnavailable as exc:
        return Check("py-spy", PROBLEM, f"{exc}; {fallback}",
                     "pip install py-spy (in the environment stalldoc runs from)", facts)
    facts["py_spy"] = binary
    error = _read_a_child(target.argv, target.env)
    if not error:
        return Check("py-spy", OK, f"py-spy reads a child of {target.python[0]}; "
                     f"{_scope_note(facts)}", facts=facts)
    if isinstance(error, ChildFailed):
        return Check("py-spy", PROBLEM, f"no child of {target.python[0]} to read: {error}",
                     "check that the command's python runs", facts)
    denied = isinstance(error, PtraceDenied)
    why = denial_reasons(facts) if denied else ""
    summary = (f"py-spy cannot read a child of {target.python[0]}: {error}"
               + (f" ({why})" if why else "") + f"; {fallback}")
    return Check("py-spy", PROBLEM, summary, PtraceDenied.HELP_TEXT if denied else
                 "upgrade py-spy (pip install -U py-spy) to one that knows this Python", facts)


def _read_a_child(python: Sequence[str], env: Mapping[str, str]) -> Exception | None:
    """None when py-spy read a fresh child of ``python``; else what stopped it."""
    try:
        proc = subprocess.Popen([*python, "-c", SLEEPER], env=dict(env),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True)
    except OSError as exc:
        return ChildFailed(f"it could not start: {exc.strerror or exc}")
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        if not ready:
            return ChildFailed(f"it did not start within {START_TIMEOUT:.0f} s")
        if proc.stdout.readline().strip() != "up":
            return ChildFailed("it ended before it could be read")
        time.sleep(0.1)
        threads = dump_pyspy(proc.pid, nonblocking=False)
        if not any(t.frames for t in threads):
            return RuntimeError("py-spy read no Python frame")
        return None
    except PtraceDenied as exc:
        return exc
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return RuntimeError(str(exc))
    finally:
        proc.kill()
        proc.wait()


def ptrace_facts() -> dict[str, object]:
    """What decides whether ptrace is allowed here: Yama's scope, our capability, a seccomp
    filter, a container."""
    status = _status_fields()
    caps = int(status.get("CapEff", "0"), 16)
    return {"ptrace_scope": _scope(), "cap_sys_ptrace": bool(caps >> CAP_SYS_PTRACE & 1),
            "uid": os.geteuid(), "seccomp": int(status.get("Seccomp", "0") or 0),
            "container": container()}


def denial_reasons(facts: dict[str, object]) -> str:
    reasons = []
    scope = facts.get("ptrace_scope")
    if scope == 3:
        reasons.append("ptrace_scope is 3: no process may be traced until reboot")
    elif scope == 2 and not facts.get("cap_sys_ptrace"):
        reasons.append("ptrace_scope is 2 and stalldoc lacks CAP_SYS_PTRACE")
    if facts.get("seccomp") == 2:
        reasons.append("a seccomp filter is on (a container's profile may deny ptrace and "
                       "process_vm_readv)")
    if facts.get("container") and not facts.get("cap_sys_ptrace"):
        reasons.append(f"in a container ({facts['container']}) without CAP_SYS_PTRACE")
    return "; ".join(reasons)


def _scope_note(facts: dict[str, object]) -> str:
    scope = facts.get("ptrace_scope")
    if scope == 1 and not facts.get("cap_sys_ptrace"):
        return ("ptrace_scope 1: watch reads its ranks (the agent names its watcher as tracer), "
                "attach to a job watch did not start needs root, CAP_SYS_PTRACE or scope 0")
    return f"ptrace_scope {scope if scope is not None else 'unknown (no Yama)'}"


def _scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def _status_fields() -> dict[str, str]:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def container() -> str:
    """The container runtime we seem to run in ('' none seen)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return ""
    for name in ("docker", "kubepods", "containerd", "lxc"):
        if name in cgroup:
            return name
    return ""
