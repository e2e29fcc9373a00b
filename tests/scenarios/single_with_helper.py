"""A single-process job (no torch, no RANK) that starts a Python helper of its own, as a one-GPU
run starts a local scoring server (a reward model, a vLLM server) beside itself, started as
``python score_rollouts.py --deepspeed ds_zero3.json`` (the way Hugging Face Trainer scripts
take their DeepSpeed config: a word on the command line, not DeepSpeed's launcher).

The helper runs ``python -c ...`` in a session of its own (detached, as servers are started),
computes for HELPER_SECONDS and writes its answer; with HELPER_SECONDS unset or negative it never
answers. The job scores a few prompts itself, then waits for the helper's answer in a function
named WAIT_FUNC (default ``wait_for_scores``), prints it and exits 0. The helper ends when the
job is gone (it polls its parent), so a job ended by stalldoc leaves nothing behind.
"""
import os
import subprocess
import sys
import time

HELPER = """\
import os, sys, time
parent, seconds = os.getppid(), float(sys.argv[1])
if seconds < 0:
    while os.getppid() == parent:
        time.sleep(0.2)
    sys.exit(0)
end, total = time.monotonic() + seconds, 0
while time.monotonic() < end:
    total += sum(i * i for i in range(20000))
print(f"scores {total % 97}", flush=True)
"""


def _wait(helper: subprocess.Popen) -> str:
    return helper.stdout.readline().strip()


def main() -> None:
    print(f"config {sys.argv[1:]}", flush=True)
    seconds = os.environ.get("HELPER_SECONDS", "-1")
    helper = subprocess.Popen([sys.executable, "-c", HELPER, seconds], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    for _ in range(3):
        sum(i * i for i in range(10000))
        time.sleep(0.1)
    name = os.environ.get("WAIT_FUNC", "wait_for_scores")
    wait = type(_wait)(_wait.__code__.replace(co_name=name, co_qualname=name), globals())
    print(f"helper said: {wait(helper)}", flush=True)
    helper.wait()


if __name__ == "__main__":
    main()
