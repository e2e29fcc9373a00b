from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from stalldoc.model.ranks import RankProcess
from stalldoc.probes.host import HostProbe
from stalldoc.probes.proc_table import ProcInfo, ProcessTable
from support import why_no_schedstat


def test_live_rank_sampled_with_cpu_percent_and_zombie_left_out():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while True:  # wait until it is a zombie (exited, not reaped)
            with open(f"/proc/{dead.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        probe = HostProbe()
        ranks = [RankProcess(0, busy.pid, 0, ()), RankProcess(1, dead.pid, 1, ())]
        first = probe.sample(time.time(), ranks)
        time.sleep(0.5)
        [second] = probe.sample(time.time(), ranks)
        assert [s.rank for s in first] == [0] and first[0].cpu_percent is None
        assert second.rank == 0 and second.rss_bytes > 0 and second.cpu_percent > 10  # a core, shared with the load
        node = probe.node(time.time())
        assert node.total_bytes >= node.available_bytes > 0 and node.cores == os.cpu_count()
    finally:
        busy.kill()
        busy.wait()
        dead.wait()


CHILD_WORK = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(child.pid, flush=True)
with open(sys.argv[1], "wb") as fh:
    while True:                      # the rank itself: writes 1 MB every 0.1 s, little CPU
        fh.write(os.urandom(1 << 20)); fh.flush(); time.sleep(0.1); fh.seek(0)
"""


def test_a_ranks_work_counts_its_children_and_its_bytes_but_not_other_ranks(tmp_path):
    # GIVEN a rank that writes ~10 MB/s and has a child burning a core, and another rank idle
    rank = subprocess.Popen([sys.executable, "-c", CHILD_WORK, str(tmp_path / "ckpt")],
                            stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = int(rank.stdout.readline())
        time.sleep(0.5)     # past start-up, when an interpreter reads its modules
        ranks = [RankProcess(0, rank.pid, 0, ()), RankProcess(1, other.pid, 1, ())]
        # the process table as the watcher sees it: the child and rank 1 both under rank 0's
        # process (as when rank 0's process spawned the other ranks): rank 1 is not its worker
        parents = {rank.pid: os.getpid(), other.pid: rank.pid, child: rank.pid}
        probe = HostProbe()
        probe.sample(time.time(), ranks, parents)
        time.sleep(1.0)
        zero, one = probe.sample(time.time(), ranks, parents)
        # THEN rank 0 shows its child's CPU and its own bytes; rank 1 shows neither
        assert zero.children == 1 and zero.children_cpu_percent > 10
        assert zero.io_bps > 1e6
        assert one.children == 0 and one.children_cpu_percent is None and one.io_bps < 1e4
    finally:
        for proc in (rank, other):
            proc.kill()
            proc.wait()
        os.kill(child, 9)



def test_an_engine_set_apart_is_its_ranks_engine_cpu_not_its_work(tmp_path):
    # GIVEN a rank whose child burns a core, and that child set apart as its serving engine
    # (with a worker of its own set apart too, as an engine core has its workers)
    rank = subprocess.Popen([sys.executable, "-c", CHILD_WORK, str(tmp_path / "ckpt")],
                            stdout=subprocess.PIPE, text=True)
    worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child = int(rank.stdout.readline())
        time.sleep(0.5)
        ranks = [RankProcess(0, rank.pid, 0, ())]
        parents = {rank.pid: os.getpid(), child: rank.pid, worker.pid: child}
        probe = HostProbe()
        probe.sample(time.time(), ranks, parents, apart=[child, worker.pid])
        time.sleep(1.0)
        [sample] = probe.sample(time.time(), ranks, parents, apart=[child, worker.pid])
        # THEN both busy processes are the rank's engine's CPU, and none of its work
        assert sample.children == 0 and sample.children_cpu_percent is None
        assert sample.engine_cpu_percent > 60, sample   # two cores' worth, shared with the load
    finally:
        for proc in (rank, worker):
            proc.kill()
            proc.wait()
        os.kill(child, 9)


# what a vLLM TP worker does in its first steps: torch.compile of its embedding's input mask,
# whose inductor runs the C++ compiler in a child process while the worker waits for it (seen in
# a healthy TP 2 engine: every engine process asleep, the compiler the one at work)
COMPILES = """
import subprocess, sys
compiler = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(compiler.pid, flush=True)
compiler.wait()
"""


def test_a_process_an_engine_worker_started_is_its_ranks_work(tmp_path):
    # GIVEN a rank, its engine worker set apart, and the worker waiting on a compiler it
    # started, which burns a core
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen([sys.executable, "-c", COMPILES], stdout=subprocess.PIPE,
                              text=True)
    try:
        compiler = int(worker.stdout.readline())
        ranks = [RankProcess(0, rank.pid, 0, ())]
        parents = {rank.pid: os.getpid(), worker.pid: rank.pid, compiler: worker.pid}
        probe = HostProbe()
        probe.sample(time.time(), ranks, parents, apart=[worker.pid])
        time.sleep(1.0)
        [sample] = probe.sample(time.time(), ranks, parents, apart=[worker.pid])
        # THEN the compiler is the rank's work (its child at a core), the waiting worker its
        # engine's
        assert sample.children == 1 and sample.children_cpu_percent > 30, sample
        assert (sample.engine_cpu_percent or 0.0) < 10, sample
    finally:
        for proc in (rank, worker):
            proc.kill()
            proc.wait()
        os.kill(compiler, 9)

SPAWNS_LATER = """
import subprocess, sys
sys.stdin.readline()
burn = "import sys, time\\nwhile time.process_time() < 0.4: pass\\nprint('burnt', flush=True)\\ntime.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", burn])
print(child.pid, flush=True)
child.wait()
"""


def test_a_child_born_since_the_last_tick_counts_in_full():
    # GIVEN a rank without children at one tick
    rank = subprocess.Popen([sys.executable, "-c", SPAWNS_LATER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ranks = [RankProcess(0, rank.pid, 0, ())]
    probe = HostProbe()
    child = None
    try:
        probe.sample(time.time(), ranks, {rank.pid: os.getpid()})
        # WHEN it starts a child that burns 0.4 s of CPU before the next tick
        rank.stdin.write("\n")
        rank.stdin.flush()
        child = int(rank.stdout.readline())
        assert rank.stdout.readline() == "burnt\n"
        [sample] = probe.sample(time.time(), ranks, {rank.pid: os.getpid(), child: rank.pid})
        # THEN all of the child's CPU counts for the rank, not only what follows its first sight
        assert sample.children == 1 and sample.children_cpu_percent > 5
    finally:
        if child:
            os.kill(child, 9)
        rank.kill()
        rank.wait()


def _table(cpu: float, start_ticks: int) -> ProcessTable:
    me = os.getpid()
    info = ProcInfo(me, os.getppid(), "python", "S", cpu, start_ticks, 1000.0 + start_ticks, 1,
                    1 << 20, ())
    return ProcessTable(0.0, {me: info}, {os.getppid(): (me,)}, uptime=100_000)


def test_a_pid_taken_by_a_new_process_is_a_new_process():
    # GIVEN a rank's pid seen with 50 s of CPU, then held by a process started later with 1 s
    probe = HostProbe()
    ranks = [RankProcess(0, os.getpid(), 0, ())]
    probe.sample(10.0, ranks, {}, _table(50.0, start_ticks=100))
    [sample] = probe.sample(11.0, ranks, {}, _table(1.0, start_ticks=900))
    # THEN its CPU is not a rate against the old process's (it would read -4900 %)
    assert sample.cpu_seconds == 1.0 and sample.cpu_percent is None
    [sample] = probe.sample(12.0, ranks, {}, _table(1.5, start_ticks=900))
    assert sample.cpu_percent == 50.0


STARVED_RANK = """
import subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a preprocessing worker
def train_loop():                    # the work runs on a thread of its own (as Ray Train's)
    while True:
        sum(range(1000))
print(child.pid, flush=True)
worker = threading.Thread(target=train_loop)
worker.start()
worker.join()
"""


@pytest.mark.skipif(bool(why_no_schedstat()), reason=why_no_schedstat())
@pytest.mark.alone
def test_a_rank_starved_of_cpu_shows_the_cpu_it_waited_for(tmp_path):
    # GIVEN a rank working on a second thread, with a worker process, both squeezed onto one CPU
    # with 16 spinning processes; and an idle rank beside it
    from load import starved
    rank = subprocess.Popen([sys.executable, "-c", STARVED_RANK], stdout=subprocess.PIPE,
                            text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = int(rank.stdout.readline())
        ranks = [RankProcess(0, rank.pid, 0, ()), RankProcess(1, idle.pid, 1, ())]
        parents = {rank.pid: os.getpid(), idle.pid: os.getpid(), child: rank.pid}
        with starved(rank.pid):
            time.sleep(0.5)
            probe = HostProbe()
            probe.sample(time.time(), ranks, parents)
            time.sleep(1.0)
            busy, quiet = probe.sample(time.time(), ranks, parents)
        # THEN the rank used little CPU and waited for it far longer than it ran, on its working
        # thread; its worker too; the idle rank waited for nothing (how long a rank waits
        # depends on what else the machine runs, as beside the suite's other workers)
        assert busy.cpu_percent < 25 and busy.cpu_wait_percent > 40, busy
        assert busy.cpu_wait_percent >= 4 * busy.cpu_percent, busy
        assert busy.children_cpu_percent < 25 and busy.children_cpu_wait_percent > 40, busy
        assert busy.children_cpu_wait_percent >= 4 * busy.children_cpu_percent, busy
        assert quiet.cpu_wait_percent is not None and quiet.cpu_wait_percent < 5, quiet
    finally:
        for proc in (rank, idle):
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.kill(child, 9)
