"""What the relay costs a job that prints a lot: the job's own write time under ``stalldoc watch``
against the same job writing straight into a file, as under Slurm's ``--output`` (the baseline,
measured in the same run, interleaved), and the relay's peak memory. Targets: slowdown <= 1.10,
relay memory bounded (it must not grow with the output). A second baseline, a pipe drained by
``cat``, is printed for scale.

    python benchmarks/relay_throughput.py [--repeats 3]

Cases: a verbose loop (compute, then a 200-byte line per step: 20 MB in all), 50 MB of 100-byte
lines, one 20 MB line without a newline, a 200 MB burst of lines. The pure-output cases show the
relay's throughput (a pipe cannot match a file's page-cache copy; ``cat`` shows that floor); the
loop shows what a job that does anything besides printing pays. The
job times its own writes (first to last byte) and prints the figure on stderr; its stdout is a
file in the temporary directory (behind the relay, or directly).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

JOB = r"""
import os, sys, time
kind, size = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
t0 = time.perf_counter()
if kind == "loop":   # a verbose training loop: some compute, one 200-byte log line per step
    data = [float(i) for i in range(3000)]
    for step in range(size // 200):
        loss = sum(x * 1e-6 for x in data)
        out.write(b"step %08d loss %.6f " % (step, loss) + b"-" * 170 + b"\n")
elif kind == "line":
    chunk = b"x" * (1 << 20)
    for _ in range(size >> 20):
        out.write(chunk)
else:
    line = b"step 0000000 loss 0.1234 lr 1e-5 " + b"y" * 65 + b"\n"
    block = line * 10000
    for _ in range(size // len(block)):
        out.write(block)
out.flush()
sys.stderr.write(f"WRITE_SECONDS {time.perf_counter() - t0:.4f}\n")
"""

CASES = [("verbose loop 20 MB", "loop", 20 << 20), ("50 MB of lines", "lines", 50 << 20),
         ("one 20 MB line", "line", 20 << 20), ("200 MB burst", "lines", 200 << 20)]


def _seconds(stderr: str) -> float:
    return float(next(l for l in stderr.splitlines() if l.startswith("WRITE_SECONDS")).split()[1])


def direct(kind: str, size: int, out: Path) -> float:
    """The job writing straight into a file."""
    with open(out, "wb") as sink:
        job = subprocess.run([sys.executable, "-c", JOB, kind, str(size)], stdout=sink,
                             stderr=subprocess.PIPE, text=True, check=True)
    return _seconds(job.stderr)


def through_cat(kind: str, size: int) -> float:
    """The job writing into a pipe that ``cat`` drains to /dev/null."""
    with open(os.devnull, "wb") as null:
        cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=null)
        job = subprocess.run([sys.executable, "-c", JOB, kind, str(size)], stdout=cat.stdin,
                             stderr=subprocess.PIPE, text=True, check=True)
        assert cat.stdin is not None
        cat.stdin.close()
        cat.wait()
    return _seconds(job.stderr)


def watched(kind: str, size: int, run_dir: Path, out: Path) -> tuple[float, int]:
    """The job under ``stalldoc watch``; (its write seconds, the relay's peak RSS in bytes)."""
    peak = [0]
    with open(out, "wb") as sink:
        relay = subprocess.Popen([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                                  str(run_dir), "--no-gpu", "--", sys.executable, "-c", JOB,
                                  kind, str(size)], stdout=sink, stderr=subprocess.PIPE,
                                 text=True)
        sampler = threading.Thread(target=_peak_rss, args=(relay, peak), daemon=True)
        sampler.start()
        _, err = relay.communicate()
        sampler.join()
    return _seconds(err), peak[0]


def _peak_rss(proc: subprocess.Popen[str], peak: list[int]) -> None:
    """The relay's high-water mark (VmHWM), read until it exits."""
    path = f"/proc/{proc.pid}/status"
    while proc.poll() is None:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        except OSError:
            return
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<18} {'to file s':>10} {'watched s':>10} {'ratio':>7} {'via cat s':>10} "
          f"{'relay peak MB':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, size in CASES:
            base, seen, cat, peaks = [], [], [], []
            for i in range(args.repeats):
                out = Path(tmp) / "out.bin"
                base.append(direct(kind, size, out))
                seconds, peak = watched(kind, size, Path(tmp) / f"{kind}-{size}-{i}", out)
                seen.append(seconds)
                peaks.append(peak)
                cat.append(through_cat(kind, size))
            b, w = statistics.median(base), statistics.median(seen)
            print(f"{label:<18} {b:>10.3f} {w:>10.3f} {w / b:>7.2f} "
                  f"{statistics.median(cat):>10.3f} {max(peaks) / 2**20:>14.1f}")


if __name__ == "__main__":
    main()
