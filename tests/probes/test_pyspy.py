"""Stack samples of busy ranks off the tick (``BackgroundStacks``), with real py-spy and real
processes: requests never wait for py-spy, one sample per rank at a time, results handed back
once, by a later call."""
from __future__ import annotations

import subprocess
import sys
import time

from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import RankStacks
from stalldoc.probes.pyspy import BackgroundStacks, StackProbe

BUSY = ("import time\n"
        "def forward():\n"
        "    end = time.time() + 60; x = 0\n"
        "    while time.time() < end: x = (x * 31 + 7) % 1000003\n"
        "forward()\n")


def _collect(background: BackgroundStacks, count: int) -> list[RankStacks]:
    out: list[RankStacks] = []
    deadline = time.time() + 60
    while len(out) < count and time.time() < deadline:
        out += background.done()
        time.sleep(0.05)
    return out


def test_requests_are_coalesced_per_rank_and_handed_back_once():
    # GIVEN two busy ranks and a pool of one worker
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    background = BackgroundStacks(StackProbe(None), workers=1)
    try:
        time.sleep(0.5)
        ranks = [RankProcess(n, p.pid, 0, ()) for n, p in enumerate(procs)]
        # WHEN each rank is asked for several times before any sample is done
        for _ in range(3):
            for rank in ranks:
                background.request(rank)
        # THEN one sample per rank is taken, read without pausing the rank
        samples = _collect(background, 2)
        assert sorted(s.rank for s in samples) == [0, 1]
        assert {s.method for s in samples} == {"py-spy-nonblocking"}
        assert all(s.main is not None and s.main.frames for s in samples), samples
        assert background.done() == []          # handed back once
        background.request(ranks[0])            # and a rank can be asked again after
        assert [s.rank for s in _collect(background, 1)] == [0]
    finally:
        background.close()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_rank_that_ended_gives_no_sample_and_no_signal():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    background = BackgroundStacks(StackProbe(None), workers=1)
    try:
        background.request(RankProcess(0, proc.pid, 0, ()))
        [sample] = _collect(background, 1)
        assert sample.method == "none" and not sample.threads and sample.error
    finally:
        background.close()


HOOKED = ("import threading\n"
          "from stalldoc.agent.hooks import marked\n"
          "def generate():\n"
          "    threading.Event().wait(60)\n"
          "def rollout():\n"
          "    return marked(generate, 'generate')()\n"
          "print('ready', flush=True)\n"
          "rollout()\n")


def test_a_stack_through_the_agents_hook_reads_as_the_user_wrote_it(tmp_path):
    # GIVEN a real process whose library call (generate) is wrapped by the agent's hook, as the
    # agent wraps vLLM's LLMEngine.step, waiting inside it
    script = tmp_path / "rollout.py"
    script.write_text(HOOKED)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        # WHEN py-spy reads its stacks
        main = StackProbe(None).capture(RankProcess(0, proc.pid, 0, ()), False).main
    finally:
        proc.kill()
        proc.wait()
    # THEN the user's call and the library's stand together: no frame of stalldoc's wrapper
    assert main is not None, "no main thread read"
    own = [f.function for f in main.frames if f.filename == str(script)]
    assert own == ["generate", "rollout", "<module>"], main.frames
    assert not any("/stalldoc/" in f.filename for f in main.frames), main.frames
