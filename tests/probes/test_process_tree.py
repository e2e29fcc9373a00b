"""Ranks told apart from launchers and from their own forked workers, with real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from stalldoc.probes.proc_table import scan
from stalldoc.probes.process_tree import RankFinder

RANK_WITH_WORKER = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\ntime.sleep(30)"


def _tree(root: subprocess.Popen, count: int) -> list[psutil.Process]:
    parent = psutil.Process(root.pid)
    deadline = time.time() + 10
    while len(parent.children(recursive=True)) < count and time.time() < deadline:
        time.sleep(0.05)
    return [parent, *parent.children(recursive=True)]


def find_ranks(procs: list[psutil.Process], single: bool = True):
    """The ranks among ``procs`` (the root first), as the watcher finds them in one tick."""
    return list(RankFinder().find(scan(), [p.pid for p in procs], (), single).ranks)


def test_ranks_and_their_forked_workers():
    launcher = ("import os, subprocess, sys, time\n"
                "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                "env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in (0, 1)]\n"
                "time.sleep(30)")
    root = subprocess.Popen([sys.executable, "-c", launcher, RANK_WITH_WORKER])
    try:
        procs = _tree(root, 4)
        ranks = find_ranks(procs)
        assert [(r.rank, r.local_rank) for r in ranks] == [(0, 0), (1, 1)]
        rank_pids = {r.pid for r in ranks}
        assert all(psutil.Process(pid).ppid() == root.pid for pid in rank_pids)
    finally:
        for proc in reversed(_tree(root, 0)):
            proc.kill()
        root.wait()


def test_single_process_is_rank_zero_and_not_its_fork():
    root = subprocess.Popen(["sh", "-c", f"exec {sys.executable} -c '{RANK_WITH_WORKER}'"],
                            env={k: v for k, v in os.environ.items() if k != "RANK"})
    try:
        procs = _tree(root, 1)
        [rank] = find_ranks(procs)
        assert (rank.rank, rank.pid, rank.from_env) == (0, root.pid, False)
        assert find_ranks(procs, single=False) == []
    finally:
        for proc in reversed(_tree(root, 0)):
            proc.kill()
        root.wait()


def _job(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A job whose processes print their pids, one line, when all are started."""
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, env=env)


def _end(job: subprocess.Popen, pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    job.kill()
    job.wait()


# a launcher starting one process per RANK value given, each printing its pid
RANKS = ("import os, subprocess, sys, time\n"
         "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
         "env={**os.environ, 'RANK': r, 'LOCAL_RANK': l}) "
         "for r, l in (a.split(',') for a in sys.argv[1:])]\n"
         "print(*(p.pid for p in ps), flush=True)\n"
         "time.sleep(60)")


def test_a_rank_that_is_no_rank_number_is_skipped_and_counted():
    # GIVEN a job with one true rank and processes whose RANK no job has (beyond 64 bits,
    # negative, not an integer), and a rank whose LOCAL_RANK is beyond 2**31
    job = _job(RANKS, "0,0", "99999999999999999999,1", "-1,2", "1e3,3", "1,4294967296")
    pids = [int(pid) for pid in job.stdout.readline().split()]
    try:
        found = RankFinder().find(scan(), [job.pid, *pids], (), single=True, root=job.pid)
        # THEN only the true ranks are ranks, the bad LOCAL_RANK is unknown, all four counted
        assert [(r.rank, r.pid, r.local_rank) for r in found.ranks] == [(0, pids[0], 0),
                                                                        (1, pids[4], None)]
        assert found.skipped == 4
    finally:
        _end(job, pids)


def test_a_single_process_with_a_bad_rank_is_still_rank_zero():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "RANK": "99999999999999999999"})
    try:
        found = RankFinder().find(scan(), [proc.pid], (), single=True, root=proc.pid)
        assert [(r.rank, r.pid, r.from_env) for r in found.ranks] == [(0, proc.pid, False)]
        assert found.skipped == 1
    finally:
        proc.kill()
        proc.wait()


# a rank whose dataloader-like worker survives it: orphaned, re-parented out of the job
ORPHAN = ("import os, subprocess, sys, time\n"
          "code = 'import os, sys, time\\nif os.fork() == 0:\\n    time.sleep(60)\\n"
          "print(os.getpid(), flush=True)\\nsys.stdin.readline()'\n"
          "rank = subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.PIPE, "
          "stdout=subprocess.PIPE, text=True, env={**os.environ, 'RANK': '0'})\n"
          "print(rank.stdout.readline().strip(), flush=True)\n"
          "sys.stdin.readline(); rank.stdin.write('\\n'); rank.stdin.flush(); rank.wait()\n"
          "time.sleep(60)")


def test_a_worker_orphaned_by_its_rank_is_not_a_rank():
    from stalldoc.launch.job import JobTree
    job = _job(ORPHAN)
    rank = int(job.stdout.readline())
    tree, finder = JobTree(job.pid, os.getpid()), RankFinder()
    worker = None
    try:
        deadline = time.time() + 10
        while len(tree.pids(scan())) < 3 and time.time() < deadline:
            time.sleep(0.02)
        table = scan()
        [worker] = table.children[rank]
        assert [r.pid for r in finder.find(table, tree.pids(table), root=job.pid).ranks] == [rank]
        # WHEN the rank ends (its launcher reaps it) and its worker is re-parented
        job.stdin.write("\n")
        job.stdin.flush()
        while rank in scan() and time.time() < deadline:
            time.sleep(0.02)
        table = scan()
        pids = tree.pids(table)
        # THEN the worker, still of the job, with RANK=0, is no rank
        assert worker in pids and table.ppid(worker) not in pids
        assert finder.find(table, pids, single=False, root=job.pid).ranks == ()
    finally:
        _end(job, [worker] if worker else [])


# a launcher that forks, and only later execs the rank: the fork has the launcher's environment
LATE_EXEC = ("import os, sys, time\n"
             "child = os.fork()\n"
             "if child == 0:\n"
             "    sys.stdin.readline()\n"
             "    os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)'],"
             " {**os.environ, 'RANK': '3'})\n"
             "print(child, flush=True)\n"
             "time.sleep(60)")


def test_environment_read_once_per_process_and_again_after_an_exec(monkeypatch):
    from stalldoc.probes import process_tree
    reads: list[int] = []
    real = process_tree.read_launch
    monkeypatch.setattr(process_tree, "read_launch", lambda pid: reads.append(pid) or real(pid))
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    job = _job(LATE_EXEC, env=env)
    child = int(job.stdout.readline())
    finder = RankFinder()
    try:
        for _ in range(3):   # between fork and exec: no rank; each process read once
            assert finder.find(scan(), [job.pid, child], single=False, root=job.pid).ranks == ()
        assert sorted(reads) == sorted([job.pid, child])
        # WHEN the forked child execs the rank (same pid, same start time)
        job.stdin.write("\n")
        job.stdin.flush()
        deadline = time.time() + 10
        found = ()
        while not found and time.time() < deadline:
            found = finder.find(scan(), [job.pid, child], single=False, root=job.pid).ranks
            time.sleep(0.02)
        # THEN its new environment is read: it is rank 3
        assert [(r.rank, r.pid) for r in found] == [(3, child)]
        assert reads.count(child) == 2 and reads.count(job.pid) == 1
    finally:
        _end(job, [child])
