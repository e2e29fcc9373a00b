"""``stalldoc check``: the launch rules and the GRPO plan of a command, without running it; and
``launch_checks``, the same within a time budget, for ``stalldoc watch`` before it launches."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from stalldoc.errors import StalldocError
from stalldoc.findings.record import finding_record
from stalldoc.launch.arguments import BadArgument
from stalldoc.launch.config import LaunchConfig, parse_command
from stalldoc.launch.coverage import unchecked
from stalldoc.launch.plan import GrpoPlan, grpo_plan
from stalldoc.launch.resources import ModelInfo, Resources, dataset_size, read_model
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import GpuSample
from stalldoc.model.window import Window
from stalldoc.probes.command_env import CommandVersions, command_versions
from stalldoc.probes.nvml import NvmlProbe
from stalldoc.redact import redact_json, redact_text
from stalldoc.rules import RULES, Rule, redacted
from stalldoc.rules.config_helpers import visible_gpus

DEFAULT_BUDGET_S = 20.0      # stalldoc check --time-budget
RESOURCES_SHARE = 0.75       # of the budget, for counting the dataset and reading the model
MEMORY_MAX = 1 << 50         # bytes per GPU believed (1 PiB)
_SIZE = re.compile(r"(\d{1,15}(?:\.\d{1,15})?)\s*([KMGT]?)(i?B)?", re.I)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
T = TypeVar("T")


class BadInput(StalldocError):
    exit_code = 2


@dataclass(frozen=True)
class LaunchChecks:
    """What the launch checks found within their time budget."""

    findings: tuple[Finding, ...]     # of the rules that finished, in catalogue order
    plan: GrpoPlan | None             # the GRPO step arithmetic (None: not GRPO, or skipped)
    resources: Resources              # GPUs, dataset rows, model sizes (unknown: None + note)
    skipped: tuple[str, ...]          # "what (why)" for each part that did not finish or run,
    #   e.g. "dataset row count (not finished in 15 s)", "SD406 generation-batch
    #   (--num_generations 0: must be a whole number >= 1 (at most 1000000))"
    unchecked: tuple[str, ...] = ()   # "what: why" for each check that had nothing to read
    #   (not swift GRPO, processes or GPUs unknown, model not local): it ran and stayed quiet


def parse_size(text: str) -> int:
    """``80G``, ``80GiB``, ``96GB`` (binary units throughout), or bytes; up to 1 PiB."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise BadInput(f"not a memory size: {text!r} (e.g. 80G)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if not 1 <= size <= MEMORY_MAX:
        raise BadInput(f"memory size {text!r} out of range (1 byte to 1 PiB)")
    return size


def _node_gpus() -> list[GpuSample]:
    probe = NvmlProbe()
    if probe.start():
        return []
    try:
        return probe.sample(time.time())
    finally:
        probe.stop()


def _window(config: LaunchConfig, seen: list[GpuSample], gpus: int | None,
            gpu_memory: int | None, dataset: tuple[int | None, str],
            model: tuple[ModelInfo | None, str],
            versions: CommandVersions = CommandVersions()) -> Window:
    resources = Resources(len(seen) or gpus, (seen[0].memory_total if seen else None) or gpu_memory,
                          dataset[0], dataset[1], model[0], model[1], versions.versions,
                          versions.source)
    return Window(time.time(), (), gpus={g.index: (g,) for g in seen}, config=config,
                  resources=resources)


def launch_window(config: LaunchConfig, seen: list[GpuSample], gpus: int | None = None,
                  gpu_memory: int | None = None, size: int | None = None,
                  command: tuple[str, ...] = ()) -> Window:
    """What the launch rules look at: the command, the GPUs NVML sees (else the user's word),
    the dataset's rows (the user's word, else the local file), the local model's size and the
    frameworks of the command's interpreter (not read without ``command``). Without a time
    limit: ``launch_checks`` is the same with one."""
    dataset = (size, "given with --dataset-size") if size is not None else dataset_size(config)
    versions = command_versions(command) if command else CommandVersions()
    return _window(config, seen, gpus, gpu_memory, dataset, read_model(config), versions)


def _start(work: Callable[[], T]) -> Future[T]:
    """``work`` running in a daemon thread: one that blocks for good (a FIFO, a hung network
    file system) neither holds the caller past its deadline nor the process at exit."""
    future: Future[T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who names it
            future.set_exception(exc)

    threading.Thread(target=run, name="stalldoc-launch-check", daemon=True).start()
    return future


def _done(value: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(value)
    return future


def _outcome(future: Future[T], deadline: float, what: str, budget_s: float,
             skipped: list[str]) -> T | None:
    """The result by the deadline, else None with ``what (why)`` added to ``skipped``."""
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        skipped.append(f"{what} (not finished in {budget_s:g} s)")
    except BadArgument as exc:
        skipped.append(f"{what} ({exc})")
    except Exception as exc:  # noqa: BLE001 - a check's failure must not stop the launch
        skipped.append(f"{what} (error: {type(exc).__name__}: {' '.join(str(exc).split())})")
    return None


def _rules(rules: list[type[Rule]], window: Window) -> list[tuple[str, Future[list[Finding]]]]:
    """Each rule started in a thread of its own, all at once."""
    return [(f"{rule.code} {rule.name}", _start(lambda rule=rule: list(rule().check(window))))
            for rule in rules]


def _findings(started: list[tuple[str, Future[list[Finding]]]], deadline: float,
              budget_s: float, skipped: list[str]) -> list[Finding]:
    """The findings of the rules done by the deadline, in the order they were started."""
    found = [_outcome(future, deadline, what, budget_s, skipped) for what, future in started]
    return [finding for findings in found if findings for finding in findings]


def launch_checks(config: LaunchConfig, gpus: list[GpuSample], budget_s: float,
                  gpu_count: int | None = None, gpu_memory: int | None = None,
                  size: int | None = None, command: tuple[str, ...] = ()) -> LaunchChecks:
    """The launch rules (SD4xx) and the GRPO plan of ``config``, returned within ``budget_s``
    seconds whatever the command names: a FIFO, a 50 GB dataset, a hung network file system,
    a number out of range. It never raises.

    ``gpus`` are the GPUs NVML sees (else ``gpu_count`` / ``gpu_memory``, the user's word);
    ``size`` the dataset's rows when the user gave them; ``command`` the command line, whose
    interpreter's frameworks are read (none without it). The dataset count, the model's
    config.json and those versions are read in threads of their own and given three quarters
    of the budget; then
    each rule runs in a thread of its own until the budget is spent. What did not finish, or
    could not run (a BadArgument: a number the parser already said is out of range in
    ``config.error``; any other exception of a rule), is named in ``skipped``, and its part is
    left out: the rest is as ``run_rules(launch_window(config, gpus), "launch")`` would give.
    Threads still blocked at the deadline are daemons, left to finish or die with the process.
    """
    start = time.monotonic()
    deadline, early, skipped = start + budget_s, start + budget_s * RESOURCES_SHARE, []
    counting = _done((size, "given with --dataset-size")) if size is not None \
        else _start(lambda: dataset_size(config))
    reading = _start(lambda: read_model(config))
    asking = _start(lambda: command_versions(command, None, budget_s * RESOURCES_SHARE)) \
        if command else _done(CommandVersions())
    what_early = budget_s * RESOURCES_SHARE
    dataset = _outcome(counting, early, "dataset row count", what_early, skipped)
    model = _outcome(reading, early, "model config.json", what_early, skipped)
    versions = _outcome(asking, early, "the command's framework versions", what_early, skipped)
    window = _window(config, gpus, gpu_count, gpu_memory,
                     dataset or (None, "not counted within the time budget"),
                     model or (None, "not read within the time budget"),
                     versions or CommandVersions({}, "not read within the time budget"))
    resources = window.resources
    assert resources is not None
    planning = _start(lambda: grpo_plan(config, resources.dataset_size, resources.dataset_note))
    launch = [rule for rule in RULES if rule.trigger == "launch"]
    started = _rules([r for r in launch if not r.fallback], window)
    plan = _outcome(planning, deadline, "GRPO plan", budget_s, skipped)
    findings = _findings(started, deadline, budget_s, skipped)
    if all(f.severity is Severity.INFO for f in findings):   # as run_rules does
        findings += _findings(_rules([r for r in launch if r.fallback], window), deadline,
                              budget_s, skipped)
    return LaunchChecks(tuple(redacted(f) for f in findings), plan, resources, tuple(skipped),
                        tuple(redact_text(u) for u in
                              unchecked(config, resources, plan, visible_gpus(window))))


def run_check(argv: list[str], gpus: int | None, gpu_memory: int | None, size: int | None,
              budget_s: float = DEFAULT_BUDGET_S) -> LaunchChecks:
    """``stalldoc check``: BadInput (exit 2, one line) for a command whose config file, DeepSpeed
    JSON or numbers cannot be used; else the launch checks within ``budget_s`` seconds."""
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise BadInput(f"time budget {budget_s}: must be a finite number of seconds > 0")
    config = parse_command(argv, dict(os.environ))
    if config.error:
        raise BadInput(config.error)
    return launch_checks(config, _node_gpus(), budget_s, gpus, gpu_memory, size, tuple(argv))


def finding_dict(finding: Finding) -> dict[str, Any]:
    """A launch finding's record, as ``check --format json`` lists it."""
    return finding_record(finding, "launch")


def launch_document(checks: LaunchChecks) -> dict[str, Any]:
    """What ``stalldoc check --format json`` prints besides the findings: the GRPO plan, the
    resources it was worked out from, the parts skipped (stored as meta ``launch_plan``)."""
    return redact_json({"plan": dataclasses.asdict(checks.plan) if checks.plan else None,
                        "resources": dataclasses.asdict(checks.resources),
                        "skipped": list(checks.skipped),
                        "not_checked": list(checks.unchecked)})


def failed(findings: list[Finding] | tuple[Finding, ...], strict: bool) -> bool:
    bad = {Severity.ERROR, Severity.CRITICAL} | ({Severity.WARNING} if strict else set())
    return any(f.severity in bad for f in findings)

