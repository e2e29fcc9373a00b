"""Ranks told apart from launchers and from their own forked workers, with real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from stalldoc.probes.process_tree import find_ranks

RANK_WITH_WORKER = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\ntime.sleep(30)"


def _tree(root: subprocess.Popen, count: int) -> list[psutil.Process]:
    parent = psutil.Process(root.pid)
    deadline = time.time() + 10
    while len(parent.children(recursive=True)) < count and time.time() < deadline:
        time.sleep(0.05)
    return [parent, *parent.children(recursive=True)]


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
