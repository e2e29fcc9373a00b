"""A job that prints a numbered line every 0.1 s, reports each signal it is sent, and exits with
a chosen code. Like a training loop whose launcher asks it (SIGUSR1 from Slurm's --signal) to
checkpoint: the signal is handled and the loop goes on.

Env: LINES (default 40), EXIT_CODE (default 0), SIGNALS (names to handle, comma-separated).
"""
import os
import signal
import sys
import time

got = []


def handler(signum, _frame):
    got.append(signal.Signals(signum).name)
    print(f"got {signal.Signals(signum).name}", flush=True)


for name in filter(None, os.environ.get("SIGNALS", "").split(",")):
    signal.signal(getattr(signal, name), handler)
print("ready", flush=True)
for i in range(int(os.environ.get("LINES", "40"))):
    print(f"step {i}", flush=True)
    time.sleep(0.1)
print(f"done {len(got)}", flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
