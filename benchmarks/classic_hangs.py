"""The classic hangs, each a real torchrun (gloo) job under watch: the cause stalldoc names against
the one the scenario was built with (for a rank waiting on its own processes: the function its
child is in), whether the culprit ranks are right, and the latency from
the stall's start to the finding (the baseline: the stall timeout, measured in the same run).
Target: every cause named right, none claimed where the evidence is missing (the controls: a
rank stuck in its own code, in a DDP job and in a plain one).

    python benchmarks/classic_hangs.py [STALL_TIMEOUT]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import torchrun  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    ranks: int
    cause: str                  # "" where none may be claimed; "child: F" the child's function
    culprits: tuple[int, ...]
    env: dict[str, str] = field(default_factory=dict)


CASES = (
    Case("uneven inputs, final barrier", "sharded_uneven.py", 2, "uneven_steps", (0,),
         {"RECORDS": "9"}),
    Case("uneven inputs, metrics gathered", "sharded_uneven.py", 3, "uneven_steps", (0,),
         {"RECORDS": "10", "AFTER": "all_gather_object"}),
    Case("uneven inputs, two ranks ahead", "sharded_uneven.py", 4, "uneven_steps", (0, 1),
         {"RECORDS": "14"}),
    Case("OOM caught, batch skipped on one rank", "skip_on_exception.py", 3, "skipped_step",
         (0, 2), {"SKIP_RANK": "1"}),
    Case("NoValidAnchorsError, rank continues", "skip_on_exception.py", 4,
         "skipped_step", (0, 1, 2), {"SKIP_RANK": "3", "VARIANT": "anchors"}),
    Case("FSDP generate, lengths differ", "sharded_generate.py", 3, "forward_count_differs",
         (2,), {"MODE": "lengths"}),
    Case("FSDP generate on rank 0 alone", "sharded_generate.py", 2, "forward_on_some_ranks",
         (0,), {"MODE": "rank0"}),
    Case("ZeRO-3 generate, lengths differ", "sharded_generate.py", 4, "forward_count_differs",
         (3,), {"MODE": "lengths", "SHARDING": "zero3"}),
    Case("ZeRO-3 generate on rank 0 alone", "sharded_generate.py", 3,
         "forward_on_some_ranks", (0,), {"MODE": "rank0", "SHARDING": "zero3"}),
    Case("checkpoint seen by some ranks", "resume_seen_by_some.py", 3, "some_ranks_only",
         (1, 2), {"SEES": "0"}),
    Case("barrier in rank 0's save branch", "rank_zero_save.py", 3, "some_ranks_only", (0,)),
    Case("DataLoader worker deadlocked after fork", "fork_lock_worker.py", 3, "child: tokenize",
         (2,), {"STUCK_RANK": "2"}),
    Case("control: DDP rank stuck in its code", "ddp_wait.py", 3, "", (2,),
         {"STUCK_RANK": "2", "STUCK_STEP": "2"}),
    Case("control: rank stuck before all_reduce", "collective_wait.py", 2, "", (1,),
         {"STUCK_RANK": "1"}),
)


def run(case: Case, timeout: float) -> tuple[str, tuple[int, ...], float]:
    """The cause named ('' if none), the ranks named, and the latency of the finding."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPT_DIR": f"{tmp}/ckpt", **case.env}
        subprocess.run([sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
                        "--stall-timeout", str(timeout), "--on-stall", "kill",
                        "--", *torchrun(case.ranks, case.script)],
                       env=env, capture_output=True, timeout=300)
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format", "json"],
            capture_output=True, text=True, check=True).stdout)
    findings = [f for f in report["findings"] if f["code"] in ("SD101", "SD102")]
    if not findings or not report["stalls"]:
        return "(no finding)", (), float("nan")
    first = findings[0]
    cause = first["evidence"].get("cause", {}).get("kind", "")
    child = first["evidence"].get("waits_on_child")
    if child:
        cause = f"child: {child['frame'].split(' (')[0]}"
    return cause, tuple(first["ranks"]), first["t"] - report["stalls"][0]["started_at"]


def main() -> None:
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    print(f"{'scenario':40} {'expected':22} {'named':22} culprits  latency (x timeout "
          f"{timeout:.0f} s)")
    right = 0
    for case in CASES:
        cause, ranks, latency = run(case, timeout)
        ok = cause == case.cause and ranks == case.culprits
        right += ok
        print(f"{case.name:40} {case.cause or '(none)':22} {cause or '(none)':22} "
              f"{'right' if ranks == case.culprits else 'WRONG ' + str(list(ranks)):9} "
              f"{latency:5.1f} s ({latency / timeout:.2f} x)")
    print(f"{right} of {len(CASES)} scenarios: cause and culprits right")


if __name__ == "__main__":
    main()
