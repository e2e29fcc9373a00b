"""What the log-signature rules (SD5xx) cost the sidecar: every line the job prints passes every
log rule once per tick.

    python benchmarks/log_rules_cost.py [--lines 50000] [--repeats 5]

The lines are the ordinary output of a GRPO run (the same mix as ``redact_cost.py``) plus NCCL
INFO lines, with none of the known signatures in them: the common case, where every rule must
look and find nothing. Printed, from the same run (medians of interleaved repeats, CPU time):
microseconds per line for all log rules as they run (each pattern first looks for its required
literal with ``in``), against the same rules running every regular expression on every line,
and the ratio of the two.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.redact_cost import ORDINARY  # noqa: E402
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES  # noqa: E402
from stalldoc.rules.log_signature import LogSignature  # noqa: E402

NCCL_INFO = ("node17-2:36754:36754 [{r}] NCCL INFO Channel 0{r}/0 : {r}[{r}] -> 1[1] via "
             "P2P/IPC/read")


def window(count: int) -> Window:
    kinds = [text for weight, text in ORDINARY for _ in range(weight)] + [NCCL_INFO] * 10
    lines = [kinds[n % len(kinds)].format(n=n, r=n % 8, step=n % 1000, pct=n % 100)
             for n in range(count)]
    return Window(100.0, (), log=tuple(LogLine(1.0, "stdout", text) for text in lines))


def cpu_seconds(rules: list[LogSignature], win: Window) -> float:
    start = time.process_time()
    for rule in rules:
        list(rule.check(win))
    return time.process_time() - start


def without_literals(rule: type[LogSignature]) -> type[LogSignature]:
    """The same rule with every required literal emptied: each regular expression on each line."""
    return type(rule.__name__, (rule,), {"_program": [("", p) for _, p in rule.program()]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    win = window(args.lines)
    classes = [r for r in RULES if issubclass(r, LogSignature)]
    fast = [rule() for rule in classes]
    slow = [without_literals(rule)() for rule in classes]
    times: dict[str, list[float]] = {"literals": [], "regex only": []}
    for _ in range(args.repeats):
        times["literals"].append(cpu_seconds(fast, win))
        times["regex only"].append(cpu_seconds(slow, win))
    per_line = {k: statistics.median(v) / args.lines * 1e6 for k, v in times.items()}
    print(f"{len(classes)} log rules, {args.lines} lines without a signature")
    for name, micros in per_line.items():
        print(f"  {name:<11} {micros:6.2f} us/line")
    print(f"  ratio       {per_line['regex only'] / per_line['literals']:6.2f}x")


if __name__ == "__main__":
    main()
