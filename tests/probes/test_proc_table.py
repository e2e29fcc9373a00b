"""One scan of the process table per tick, against real process trees: parents, zombies, start
times, I/O, and the job tree drawn from the snapshot."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from stalldoc.run.job import JobTree
from stalldoc.probes.proc_table import ProcessGone, read_io, scan

# a parent that forks two sleeping workers and prints their pids
FORKS = ("import os, sys, time\n"
         "kids = [os.fork() for _ in range(2)]\n"
         "if 0 in kids:\n    time.sleep(60); os._exit(0)\n"
         "print(*kids, flush=True)\n"
         "time.sleep(60)")


@pytest.fixture
def forking_parent():
    proc = subprocess.Popen([sys.executable, "-c", FORKS], stdout=subprocess.PIPE, text=True)
    kids = [int(pid) for pid in proc.stdout.readline().split()]
    yield proc.pid, kids
    for pid in kids:
        os.kill(pid, 9)
    proc.kill()
    proc.wait()


def _wait_state(pid: int, state: str) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        info = scan().get(pid)
        if info is not None and info.state == state:
            return
        time.sleep(0.02)
    raise AssertionError(f"{pid} never reached state {state}")


def test_one_scan_holds_the_tree_with_what_psutil_says(forking_parent):
    parent, kids = forking_parent
    for pid in (parent, *kids):   # settled in their sleep: the state compared below holds still
        _wait_state(pid, "S")
    table = scan()
    # the tree: parents and children, both ways
    assert table.ppid(parent) == os.getpid() and parent in table.children[os.getpid()]
    assert sorted(table.children[parent]) == sorted(kids)
    assert set(table.subtree(os.getpid())) >= {parent, *kids}
    assert all(table.ppid(kid) == parent for kid in kids)
    # the figures psutil gives process by process, here from one pass
    for pid in (parent, *kids):
        info, proc = table.get(pid), psutil.Process(pid)
        assert info.started_at == proc.create_time()
        assert info.threads == proc.num_threads() and info.status == proc.status()
        assert info.name == proc.name() and info.rss_bytes > 0
        assert abs(info.cpu_seconds - sum(proc.cpu_times()[:2])) < 0.5
    # workers forked from one parent: one program, each its own start
    assert len({table.get(pid).exec_key for pid in (parent, *kids)}) == 1
    assert table.ppid(-1) == 0 and table.get(-1) is None


def test_a_zombie_is_in_the_table_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait_state(child.pid, "Z")
        info = scan().get(child.pid)
        assert info.dead and info.status == psutil.STATUS_ZOMBIE and info.rss_bytes == 0
    finally:
        child.wait()
    assert child.pid not in scan()


def test_an_exec_changes_the_identity_a_fork_does_not():
    # a process that execs a new program keeps its pid and start time, not its identity
    code = "import os, sys, time; sys.stdin.readline(); os.execv('/bin/sleep', ['sleep', '30'])"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
    try:
        _wait_state(proc.pid, "S")
        before = scan().get(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        deadline = time.time() + 10
        while scan().get(proc.pid).name != "sleep" and time.time() < deadline:
            time.sleep(0.02)
        after = scan().get(proc.pid)
        assert (after.pid, after.start_ticks) == (before.pid, before.start_ticks)
        assert after.identity != before.identity
    finally:
        proc.kill()
        proc.wait()


def test_io_counts_bytes_written_and_an_ended_process_is_gone(tmp_path):
    code = ("import sys\nsys.stdin.readline()\n"
            f"open({str(tmp_path / 'out')!r}, 'wb').write(b'x' * 4_000_000)\n"
            "print('written', flush=True)\nsys.stdin.readline()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        before = read_io(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "written\n"
        assert read_io(proc.pid) - before >= 4_000_000
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(ProcessGone):
        read_io(proc.pid)


# the job: a child that forks a grandchild, prints both pids and exits when told to
ORPHANING = ("import os, sys, time\n"
             "child = os.fork()\n"
             "if child == 0:\n"
             "    grandchild = os.fork()\n"
             "    if grandchild == 0:\n        time.sleep(60); os._exit(0)\n"
             "    print(os.getpid(), grandchild, flush=True)\n"
             "    sys.stdin.readline(); os._exit(0)\n"
             "os.waitpid(child, 0)\n"
             "time.sleep(60)")


def test_job_tree_keeps_an_orphan_and_leaves_out_the_excluded_tree(forking_parent):
    # GIVEN a job of three generations, and a tree beside it that the caller excludes
    other, other_kids = forking_parent
    job = subprocess.Popen([sys.executable, "-c", ORPHANING], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    child, grandchild = (int(pid) for pid in job.stdout.readline().split())
    tree = JobTree(job.pid, reaper=os.getpid())
    try:
        assert tree.pids(scan(), exclude=other) == [job.pid, child, grandchild]
        # WHEN the middle one exits (and is reaped): its child is re-parented out of the job
        job.stdin.write("\n")
        job.stdin.flush()
        deadline = time.time() + 10
        while child in scan() and time.time() < deadline:
            time.sleep(0.02)
        table = scan()
        assert table.ppid(grandchild) not in (child, job.pid, os.getpid())
        # THEN the job is its command and the orphan, once seen, still; never the other tree
        assert tree.pids(table, exclude=other) == [job.pid, grandchild]
        assert not {other, *other_kids} & set(tree.pids(scan(), exclude=other))
    finally:
        os.kill(grandchild, 9)
        job.kill()
        job.wait()


def test_a_child_of_the_reaper_older_than_the_job_is_none_of_its_orphans():
    # GIVEN a process the reaper started before the job (a server it runs beside the job, or
    # what an earlier job of this process left), then the job, and an orphan of the job
    # re-parented to the reaper (a child of the reaper started after the job)
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.05)   # clock ticks of 10 ms: the job starts later than it
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    adopted = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        table = scan()
        assert table.procs[older.pid].start_ticks < table.procs[job.pid].start_ticks
        # THEN the job is its command and the later child; the older one is not of it
        assert JobTree(job.pid, reaper=os.getpid()).pids(table) == [job.pid, adopted.pid]
    finally:
        for proc in (older, job, adopted):
            proc.kill()
            proc.wait()
