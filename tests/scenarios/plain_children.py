"""A torchrun job (gloo) whose every rank runs a plain Python tool as a child process, as a
code-execution reward or a data-preparation step does: the child never imports ``threading``
itself, sleeps CHILD_SECONDS (a comma list, one per rank, the last repeated), then says whether
``threading.main_thread()`` is its own main thread and exits with CHILD_CODE. Each rank checks
the child's exit status and output, then all meet in a barrier and leave."""
import os
import subprocess
import sys

import torch.distributed as dist

CHILD = """
import sys, time
time.sleep(float(sys.argv[1]))
import _thread, threading
print("main thread is mine:", threading.main_thread().ident == _thread.get_ident(),
      threading.current_thread() is threading.main_thread(), flush=True)
sys.exit(int(sys.argv[2]))
"""


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lengths = os.environ.get("CHILD_SECONDS", "1").split(",")
    seconds = lengths[min(rank, len(lengths) - 1)]
    code = int(os.environ.get("CHILD_CODE", "0"))
    child = subprocess.run([sys.executable, "-c", CHILD, seconds, str(code)],
                           capture_output=True, text=True, timeout=float(seconds) + 60)
    print(f"rank {rank}: child of {seconds} s exited {child.returncode}: "
          f"{child.stdout.strip()}", flush=True)
    if child.returncode != code:
        raise SystemExit(f"rank {rank}: the child exited {child.returncode}: {child.stderr}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
