"""``stalldoc doctor --gpu``: a short end-to-end on the real device. Each case of ``gpu_job.py``
runs under ``stalldoc watch`` in the job's interpreter, and its report is judged:

- cuda-markers: markers issued at phase entries, and the GPU completed every one of them;
- nvml-memory: NVML's per-process memory against ``torch.cuda.memory_reserved()``: at least the
  reserved pool, at most ``CONTEXT_TOLERANCE`` above it (the CUDA context and libraries);
- sd203-kernel-hang: a kernel that does not end is named SD203 within stall timeout + 5 s;
- sd201-offload: pinned host-to-device copies with an idle GPU are offload traffic (SD201);
- sd202-retries: allocator retries under memory pressure are SD202;
- nccl-flight-recorder: a one-rank NCCL group's Flight Recorder dump is read back;
- graph-capture: CUDA graphs captured in the default (global) mode while the agent polls its
  markers all succeed, and the agent's CUDA telemetry stays on.

``tests/gpu/`` asserts the same checks (``python -m pytest -m gpu``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from stalldoc.analysis.flight_recorder import op_name, read_dump
from stalldoc.doctor.model import OK, PROBLEM, SKIPPED, Check
from stalldoc.probes.interpreter import Target

JOB = Path(__file__).resolve().parent / "gpu_job.py"
CONTEXT_TOLERANCE = 1 << 30        # bytes NVML may show above the reserved pool
HANG_TIMEOUT = 12.0                # SD203 wants the oldest pending marker 10 s old at the stall
STALL_TIMEOUT = 6.0
CASE_LIMIT = 150.0                 # seconds one case may run


@dataclass(frozen=True)
class Run:
    """One case watched: watch's exit code, its stderr, the report (None: unreadable)."""

    code: int | None
    stderr: str
    report: dict[str, Any] | None
    run_dir: Path


def watch_case(target: Target, case: str, work: Path, stall_timeout: float,
               extra_env: dict[str, str] | None = None) -> Run:
    run_dir = work / case
    command = [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
               "--interval", "0.5", "--stall-timeout", str(stall_timeout), "--on-stall", "kill",
               "--kill-grace", "3", "--", *target.argv, str(JOB), case]
    env = {**target.env, **(extra_env or {})}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=CASE_LIMIT,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return Run(None, str(exc.stderr or ""), None, run_dir)
    out = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format",
                          "json"], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout) if out.returncode == 0 else None
    return Run(proc.returncode, proc.stderr, report, run_dir)


def _findings(run: Run, code: str) -> list[dict[str, Any]]:
    return [f for f in (run.report or {}).get("findings", []) if f["code"] == code]


def _failed(name: str, run: Run, expected: str) -> Check:
    tail = " | ".join(run.stderr.strip().splitlines()[-3:])[-400:]
    return Check(name, PROBLEM, f"expected {expected}; watch exited {run.code}: {tail}",
                 "run it again with the job's own output: the case is in "
                 f"{JOB.name}; report the run directory {run.run_dir} to us")


def judge_markers(run: Run) -> list[Check]:
    if run.code != 0 or run.report is None:
        return [_failed("cuda-markers", run, "exit 0"), _failed("nvml-memory", run, "exit 0")]
    points = [p for p in run.report["timeseries"]["ranks"] if p["cuda_host_marker"]]
    if not points:
        markers = Check("cuda-markers", PROBLEM, "no CUDA marker was recorded",
                        "see docs/telemetry.md (the agent's CUDA markers)")
    else:
        last = points[-1]
        done = last["cuda_gpu_marker"] == last["cuda_host_marker"]
        markers = Check("cuda-markers", OK if done else PROBLEM,
                        f"{last['cuda_host_marker']} markers issued, the GPU completed "
                        f"{last['cuda_gpu_marker']}", "" if done else
                        "the agent's event polling lags: report it to us",
                        {"issued": last["cuda_host_marker"],
                         "completed": last["cuda_gpu_marker"]})
    return [markers, _judge_memory(run.report)]


def _judge_memory(report: dict[str, Any]) -> Check:
    pairs = [(p["gpu_memory_bytes"], p["cuda_reserved"]) for p in report["timeseries"]["ranks"]
             if p["gpu_memory_bytes"] is not None and (p["cuda_reserved"] or 0) >= 2**31]
    if not pairs:
        return Check("nvml-memory", PROBLEM, "no tick with both NVML's per-process memory and "
                     "the allocator's reserved pool of 2 GiB", "see the nvml check above")
    nvml, reserved = pairs[-1]
    within = 0 <= nvml - reserved <= CONTEXT_TOLERANCE
    return Check("nvml-memory", OK if within else PROBLEM,
                 f"NVML {nvml / 2**30:.2f} GiB for the process, reserved {reserved / 2**30:.2f}"
                 f" GiB: {(nvml - reserved) / 2**20:.0f} MiB above (tolerance "
                 f"{CONTEXT_TOLERANCE >> 20} MiB)", "" if within else
                 "NVML's figure is not the process's: a container hiding host pids?",
                 {"nvml_bytes": nvml, "reserved_bytes": reserved})


def judge_kernel_hang(run: Run) -> list[Check]:
    found = _findings(run, "SD203")
    if run.code != 124 or not found or not run.report or not run.report["stalls"]:
        return [_failed("sd203-kernel-hang", run, "a stall named SD203 (exit 124)")]
    started = run.report["stalls"][0]["started_at"]
    late = found[0]["t"] - started
    ok = late <= HANG_TIMEOUT + 5
    return [Check("sd203-kernel-hang", OK if ok else PROBLEM,
                  f"SD203 {late:.1f} s after the last work (stall timeout {HANG_TIMEOUT:.0f} s):"
                  f" {found[0]['summary']}", "" if ok else "SD203 came late: report it to us",
                  {"seconds": round(late, 1)})]


def judge_present(name: str, code: str) -> Callable[[Run], list[Check]]:
    def judge(run: Run) -> list[Check]:
        found = _findings(run, code)
        if run.code != 0 or not found:
            return [_failed(name, run, f"{code} and exit 0")]
        return [Check(name, OK, f"{code}: {found[0]['summary']}")]
    return judge


def judge_flight(run: Run) -> list[Check]:
    dumps = (run.report or {}).get("flight_dumps", [])
    if run.code != 124 or dumps != ["flight/rank_0"]:
        return [_failed("nccl-flight-recorder", run, "a stall and flight/rank_0")]
    dump = read_dump(run.run_dir / dumps[0])
    reduces = [e for e in dump.entries if op_name(e) == "all_reduce"]
    ok = len(reduces) >= 6 and all(e.op.startswith("nccl:") for e in reduces)
    return [Check("nccl-flight-recorder", OK if ok else PROBLEM,
                  f"flight/rank_0 read back: {len(dump.entries)} entries, "
                  f"{len(reduces)} NCCL all_reduce", "" if ok else "report the dump to us",
                  {"entries": len(dump.entries)})]


def judge_graph_capture(run: Run) -> list[Check]:
    errors = run.run_dir / "agent-errors.log"
    said = errors.read_text(errors="replace") if errors.exists() else ""
    issued = max((p["cuda_host_marker"] or 0 for p in (run.report or {}).get(
        "timeseries", {}).get("ranks", [])), default=0)
    if run.code != 0 or "CUDA" in said or not issued:
        return [_failed("graph-capture", run, "exit 0, markers, and no CUDA line in "
                        f"agent-errors.log (it says: {said.strip()[-300:] or 'nothing'})")]
    return [Check("graph-capture", OK, f"graphs captured and replayed under the agent; "
                  f"{issued} markers outside the captures", facts={"markers": issued})]


CASES: tuple[tuple[str, float, dict[str, str], Callable[[Run], list[Check]]], ...] = (
    ("markers", 30.0, {}, judge_markers),
    ("kernel_hang", HANG_TIMEOUT, {}, judge_kernel_hang),
    ("offload", 30.0, {}, judge_present("sd201-offload", "SD201")),
    ("retries", 30.0, {}, judge_present("sd202-retries", "SD202")),
    ("nccl_flight", STALL_TIMEOUT, {}, judge_flight),
    ("graph_capture", 30.0, {}, judge_graph_capture),
)


def gpu_checks(target: Target, cuda: Check, cases: Sequence[str] = ()) -> list[Check]:
    """The end-to-end checks on the device (``cases``: a subset by name); skipped with the
    reason when the job's torch sees no CUDA device."""
    if cuda.status != OK:
        return [Check("gpu-end-to-end", SKIPPED, f"no CUDA device for the job's torch "
                      f"({cuda.summary})")]
    work = Path(tempfile.mkdtemp(prefix="stalldoc-doctor-gpu-"))   # kept: the runs to report
    checks: list[Check] = []
    for case, timeout, env, judge in CASES:
        if not cases or case in cases:
            checks += judge(watch_case(target, case, work, timeout, env))
    return checks
