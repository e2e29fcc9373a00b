"""stallbench: every scenario under every arm, one table and one plot.

    python benchmarks/stallbench/run.py                      # everything, into docs/
    python benchmarks/stallbench/run.py --scenarios h17 --arms stalldoc,pyspy --out /tmp/sb

Each run's folder (the arm's output, the job's stdout and stderr, the truth marks) is kept under
``--work``; the scores go to ``OUT/stallbench.json``, the table to ``OUT/stallbench.md`` and the
plot to ``OUT/stallbench.svg``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms  # noqa: E402
import table  # noqa: E402
import harness  # noqa: E402
from harness import execute  # noqa: E402
from scenario import every  # noqa: E402
from score import Score, score  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="", help="name prefixes, comma separated")
    parser.add_argument("--arms", default=",".join(arms.NAMES))
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/stallbench"))
    parser.add_argument("--rescore", action="store_true",
                        help="run nothing: read and score again the runs kept in WORK (after a "
                             "change to an arm's reading or to the scoring)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the scores already in WORK/scores.jsonl (a run cut off goes "
                             "on where it stopped, with the same code)")
    options = parser.parse_args()
    chosen = [s for s in every() if not options.scenarios
              or any(s.name.startswith(p) for p in options.scenarios.split(","))]
    options.work.mkdir(parents=True, exist_ok=True)
    if options.rescore:
        return publish(rescored(chosen, options), options.out, options.arms.split(","))
    kept = options.work / "scores.jsonl"
    done = [json.loads(row) for row in kept.read_text().splitlines()] \
        if options.resume and kept.exists() else []
    if not options.resume:
        kept.write_text("")
    seen = {(row["score"]["scenario"], row["score"]["arm"]) for row in done}
    for scenario in chosen:
        for name in options.arms.split(","):
            arm = arms.load(name)
            if (scenario.name, arm.name) in seen:
                continue
            began = time.time()
            result = one(scenario, arm, options.work / scenario.name / arm.name)
            done.append({"began": began, "ended": time.time(), "commit": commit(),
                         "score": asdict(result)})
            with kept.open("a") as out:
                out.write(json.dumps(done[-1]) + "\n")
            print(line(result), flush=True)
    publish(done, options.out, options.arms.split(","))


def rescored(chosen: list, options: argparse.Namespace) -> list[dict]:
    """Every kept run of the chosen scenarios and arms, read and scored again."""
    done = []
    for scenario in chosen:
        for name in options.arms.split(","):
            arm = arms.load(name)
            run = harness.kept(options.work / scenario.name / arm.name)
            if run is not None:
                result = score(scenario, arm.name, run, arm.read(run))
                done.append({"began": run.started, "ended": run.ended, "commit": commit(),
                             "score": asdict(result)})
                print(line(result), flush=True)
    return done


def publish(done: list[dict], out: Path, order: list[str]) -> None:
    """The table, the plot and every score, in ``out``."""
    scores = sorted((Score(**row["score"]) for row in done),
                    key=lambda s: (s.scenario, order.index(s.arm) if s.arm in order else 99))
    began = min((row["began"] for row in done), default=time.time())
    ended = max((row["ended"] for row in done), default=time.time())
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/stallbench/run.py " + " ".join(sys.argv[1:])
    # the code each run was made with (a run resumed over several sessions keeps one commit
    # unless the code changed between them: then the table names each)
    commits = sorted({row.get("commit") or commit() for row in done}) or [commit()]
    (out / "stallbench.json").write_text(json.dumps(
        {"began": began, "ended": ended, "command": command.strip(), "machine": machine(),
         "commit": ", ".join(commits), "runs": done}, indent=1))
    hours = sum(row["ended"] - row["began"] for row in done) / 3600
    where = f"{machine()}, at commit {', '.join(commits)}"
    table.write(scores, out, began, ended, command.strip(), where, hours)


def commit() -> str:
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True)
    return found.stdout.strip()


def machine() -> str:
    """The machine in words: cores, memory, Python, torch."""
    import platform

    import psutil
    found = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    return (f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
            f"Python {platform.python_version()}, torch {found.stdout.strip() or 'absent'}")


def one(scenario, arm, folder: Path) -> Score:
    lacking = scenario.missing()
    why = f"needs {lacking}" if lacking else arm.unavailable(scenario)
    if why:
        return Score(scenario.name, arm.name, scenario.truth, False, "", skipped=why)
    run = execute(scenario, arm, folder)
    return score(scenario, arm.name, run, arm.read(run))


def line(s: Score) -> str:
    if s.skipped:
        return f"{s.scenario:40} {s.arm:16} skipped: {s.skipped}"
    if s.truth == "healthy":
        return (f"{s.scenario:40} {s.arm:16} healthy  false stall {s.false_stall} "
                f"killed {s.killed}  {s.said[:80]}")
    took = "-" if s.seconds is None else f"{s.seconds:.0f}s"
    return (f"{s.scenario:40} {s.arm:16} culprit {s.culprit:d} frame {s.frame:d} "
            f"cause {s.cause:d} {took:>5}  {s.said[:90]}")


if __name__ == "__main__":
    main()
