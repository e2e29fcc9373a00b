"""Run every check and say the answer: one line per check (``text``) or a JSON document; the exit
code is 1 when a check found a problem, else 0."""
from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from stalldoc.doctor.agent_load import check_agent
from stalldoc.doctor.gpus import check_cuda, check_nvml
from stalldoc.doctor.model import OK, PROBLEM, Check
from stalldoc.doctor.port import check_port
from stalldoc.doctor.rundir import check_run_dir
from stalldoc.doctor.stacks import check_stacks
from stalldoc.probes.interpreter import Target, resolve
from stalldoc.doctor.versions import check_flight_recorder, check_versions, installed
from stalldoc.redact import redact_text

EXIT_OK, EXIT_PROBLEM = 0, 1
JSON_VERSION = 1


@dataclass(frozen=True)
class DoctorOptions:
    command: tuple[str, ...] = ()
    run_dir: Path | None = None
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    fmt: str = "text"
    gpu: bool = False               # also the end-to-end cases on the device (doctor.gpu)


def run_checks(options: DoctorOptions) -> list[Check]:
    target = resolve(options.command)
    checks = [_command_check(options.command, target)]
    if target.error:
        target = resolve(())
    agent, seen = check_agent(target)
    cuda, torch_facts = check_cuda(target, seen.get("versions", {}))
    checks += [check_stacks(target, agent.status == OK), agent, check_nvml(), cuda,
               check_run_dir(options.run_dir),
               check_versions(installed(seen.get("versions", {}), torch_facts)),
               check_flight_recorder(torch_facts),
               check_port(options.metrics_port, options.metrics_addr)]
    if options.gpu:
        from stalldoc.doctor.gpu import gpu_checks
        checks += gpu_checks(target, cuda)
    return checks


def _command_check(command: Sequence[str], target: Target) -> Check:
    if target.error:
        return Check("command", PROBLEM, f"{target.error}: watch would exit 127; the checks "
                     "below use stalldoc's own python", "give the command as you would run it")
    facts = {"python": list(target.python), "how": target.how}
    return Check("command", OK, f"its python: {' '.join(target.python)}, {target.how}",
                 facts=facts)


def render(checks: list[Check], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"version": JSON_VERSION,
                           "ok": not any(c.status == PROBLEM for c in checks),
                           "checks": [c.as_dict() for c in checks]}, indent=2, default=str)
    width = max(len(c.name) for c in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.status:<8} {check.name:<{width}}  {check.summary}")
        if check.fix and check.status != OK:
            lines.append(textwrap.indent(f"fix: {check.fix}", " " * (width + 11)))
    return "\n".join(lines)


def doctor(options: DoctorOptions) -> int:
    checks = run_checks(options)
    sys.stdout.write(redact_text(render(checks, options.fmt)) + "\n")
    return EXIT_PROBLEM if any(c.status == PROBLEM for c in checks) else EXIT_OK
