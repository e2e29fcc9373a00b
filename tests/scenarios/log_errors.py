"""A job that prints known error lines (as swift / torch / vLLM print them) and carries on:
an OOM line REPEAT times over a few seconds, a rollout-server line once; exits 0."""
import os
import sys
import time

REPEAT = int(os.environ.get("REPEAT", "3"))

for n in range(REPEAT):
    print(f"[rank{n % 2}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.",
          file=sys.stderr, flush=True)
    time.sleep(0.8)
print("Exception: Servers not reachable after 240.0s", flush=True)
time.sleep(1.5)
print("done", flush=True)
