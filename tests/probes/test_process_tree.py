"""Ranks told apart from launchers and from their own forked workers, with real processes."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import psutil
import pytest

from stalldoc.probes.proc_table import scan
from stalldoc.probes import process_tree
from stalldoc.probes.process_tree import Launch, RankFinder

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


# a launcher starting one process per RANK value given, then printing their pids once each has
# said it runs (a process read just after its exec may show no environment yet: CI saw a rank
# missed so on a loaded machine)
RANKS = ("import os, subprocess, sys, time\n"
         "ps = [subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); "
         "time.sleep(60)'], stdout=subprocess.PIPE, "
         "env={**os.environ, 'RANK': r, 'LOCAL_RANK': l}) "
         "for r, l in (a.split(',') for a in sys.argv[1:])]\n"
         "[p.stdout.readline() for p in ps]\n"
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
    from stalldoc.run.job import JobTree
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


# A process tree from a spec: each node is (name, extra argv, environment, children); every
# process appends "name pid" to TREE_OUT, then sleeps. Its command line is ``python tree.py
# SPEC PATH`` and its extra argv; the spec is read from a file (not seen in any command line).
TREE = """import json, os, subprocess, sys, time
spec, path = json.load(open(sys.argv[1])), sys.argv[2]
node = spec
for index in filter(None, path.split(".")):
    node = node[3][int(index)]
for index, child in enumerate(node[3]):
    subprocess.Popen([sys.executable, __file__, sys.argv[1], f"{path}.{index}", *child[1]],
                     env={**os.environ, **child[2]})
open(os.environ["TREE_OUT"], "a").write(f"{node[0]} {os.getpid()}\\n")
time.sleep(60)
"""


def _tree_of(tmp_path, spec) -> tuple[subprocess.Popen, dict[str, int]]:
    """Start the tree ``spec`` (name, argv, env, children); its processes' pids by name."""
    import json
    out, script, spec_file = tmp_path / "tree.txt", tmp_path / "tree.py", tmp_path / "spec.json"
    script.write_text(TREE)
    spec_file.write_text(json.dumps(spec))
    names, stack = [], [spec]
    while stack:
        node = stack.pop()
        names.append(node[0])
        stack.extend(node[3])
    env = {**{k: v for k, v in os.environ.items() if k != "RANK"}, **spec[2],
           "TREE_OUT": str(out)}
    root = subprocess.Popen([sys.executable, str(script), str(spec_file), "", *spec[1]], env=env)
    deadline = time.time() + 20
    pids: dict[str, int] = {}
    while len(pids) < len(names) and time.time() < deadline:
        time.sleep(0.05)
        pids = dict((n, int(p)) for n, p in (line.split() for line in
                                             out.read_text().splitlines())) if out.exists() else {}
    assert len(pids) == len(names), pids
    return root, pids


def _ranks_of(root, pids, claims, finder=None, single=False):
    """What the finder makes of the tree, given what its processes' agents claim (by name)."""
    from stalldoc.run.job import JobTree
    table = scan()
    found = (finder or RankFinder()).find(
        table, JobTree(root.pid, os.getpid()).pids(table), (), single=single, root=root.pid,
        claims={pids[name]: claim for name, claim in claims.items()})
    by_pid = {pid: name for name, pid in pids.items()}
    return [(r.rank, by_pid[r.pid], r.source, r.world_rank) for r in found.ranks]


def _leaf(name, args=(), env=None):
    return (name, list(args), env or {}, [])


def test_a_slurm_task_that_spawns_its_ranks_is_their_launcher(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN an srun task (SLURM_PROCID=1) that mp.spawns two ranks and has a resource tracker;
    # every process inherited SLURM_PROCID=1, the ranks claimed ranks 2, 3 of their group
    slurm = {"SLURM_PROCID": "1"}
    spec = ("task", [], slurm, [_leaf("rank2", ["--multiprocessing-fork"]),
                                _leaf("rank3", ["--multiprocessing-fork"]),
                                _leaf("tracker", ["multiprocessing.resource_tracker"])])
    root, pids = _tree_of(tmp_path, spec)
    try:
        inherited = RankClaim("SLURM_PROCID", 1)
        claims = {"task": inherited, "tracker": inherited,
                  "rank2": RankClaim("process group", 2, None, 4, "10.0.0.1:29500"),
                  "rank3": RankClaim("process group", 3, None, 4, "10.0.0.1:29500")}
        # THEN the spawned processes are the ranks; the task that started them is none
        assert _ranks_of(root, pids, claims) == [(2, "rank2", "process group", None),
                                                 (3, "rank3", "process group", None)]
        # and before they joined the group, the task stands for its Slurm rank alone
        before = {**claims, "rank2": inherited, "rank3": inherited}
        assert _ranks_of(root, pids, before) == [(1, "task", "SLURM_PROCID", None)]
    finally:
        _kill(root)


def test_rays_processes_are_ranks_only_once_they_join_a_group(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN a Ray driver (in a Slurm step) whose raylet (not Python: no agent) started pooled
    # workers and the dashboard; all inherited SLURM_PROCID=0, two workers joined a group
    ray = lambda name, *args: _leaf(name, ["ray/_private/workers/default_worker.py", *args])
    spec = ("driver", [], {"SLURM_PROCID": "0"}, [
        ("raylet", ["/site-packages/ray/core/src/ray/raylet/raylet"], {}, [
            ray("idle"), ray("trainer0"), ray("trainer1"),
            _leaf("dashboard", ["ray/dashboard/agent.py"])])])
    root, pids = _tree_of(tmp_path, spec)
    try:
        inherited = RankClaim("SLURM_PROCID", 0)
        claims = {name: inherited for name in ("driver", "idle", "trainer0", "trainer1",
                                               "dashboard")}
        claims["trainer0"] = RankClaim("process group", 0, 0, 2, "127.0.0.1:40001")
        claims["trainer1"] = RankClaim("process group", 1, 1, 2, "127.0.0.1:40001")
        assert _ranks_of(root, pids, claims) == [(0, "trainer0", "process group", None),
                                                 (1, "trainer1", "process group", None)]
        # before any joined: no rank at all; the driver started a Ray node and hands its work
        # to Ray's workers (it waits in ray.get, which is no stall of a rank), no Ray process
        claims["trainer0"] = claims["trainer1"] = inherited
        assert _ranks_of(root, pids, claims, single=True) == []
        assert _ranks_of(root, pids, {}, single=True) == []
    finally:
        _kill(root)


def test_a_driver_that_started_a_ray_node_is_no_guessed_rank(tmp_path):
    # GIVEN `python train.py` (Ray Train, verl): no claim anywhere yet
    (tmp_path / "before").mkdir(), (tmp_path / "after").mkdir()
    alone, alone_pids = _tree_of(tmp_path / "before", ("driver", [], {}, []))
    try:
        # THEN before ray.init the script itself stands for rank 0
        assert _ranks_of(alone, alone_pids, {}, single=True) == [(0, "driver", "", None)]
    finally:
        _kill(alone)
    # WHEN ray.init() started a local node (GCS, raylet and its pooled workers) below it
    spec = ("driver", [], {}, [
        _leaf("gcs", ["/site-packages/ray/core/src/ray/gcs/gcs_server", "--node-ip=1.2.3.4"]),
        ("raylet", ["/site-packages/ray/core/src/ray/raylet/raylet"], {}, [
            _leaf("pooled", ["ray/_private/workers/default_worker.py"])])])
    root, pids = _tree_of(tmp_path / "after", spec)
    try:
        # THEN it is their launcher: no rank until a worker claims one (its wait in ray.get
        # would otherwise be judged as a stuck rank 0)
        finder = RankFinder()
        assert _ranks_of(root, pids, {}, finder, single=True) == []
        # and stays none after ray.shutdown() ended its node
        for name in ("pooled", "raylet", "gcs"):
            psutil.Process(pids[name]).kill()
        _wait_gone(pids["gcs"], pids["raylet"])
        assert _ranks_of(root, pids, {}, finder, single=True) == []
        assert _ranks_of(root, pids, {}, single=True) == [(0, "driver", "", None)]   # (new eyes)
    finally:
        _kill(root)


def test_a_ray_worker_with_a_ranks_env_vars_is_a_rank_once_it_joins_its_group(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN verl's RayWorkerGroup: each actor's rank in its runtime_env env_vars (RANK at exec),
    # and a spare worker Ray started with the same env_vars (it ends it unused under load)
    worker = lambda name, rank: _leaf(name, ["ray/_private/workers/default_worker.py"],
                                      {"RANK": rank, "WORLD_SIZE": "2"})
    spec = ("driver", [], {}, [
        ("raylet", ["/site-packages/ray/core/src/ray/raylet/raylet"], {}, [
            worker("actor0", "0"), worker("actor1", "1"), worker("spare1", "1")])])
    root, pids = _tree_of(tmp_path, spec)
    try:
        # THEN none is a rank by RANK alone: not the spare, not an actor before it joined
        assert _ranks_of(root, pids, {}, single=True) == []
        # and the actors are, once they joined their group
        group = lambda r: RankClaim("process group", r, r, 2, "127.0.0.1:30001")
        claims = {"actor0": group(0), "actor1": group(1), "spare1": RankClaim("RANK", 1)}
        assert _ranks_of(root, pids, claims) == [(0, "actor0", "process group", None),
                                                 (1, "actor1", "process group", None)]
    finally:
        _kill(root)


def test_several_worlds_are_numbered_apart_and_keep_their_numbers(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN verl's pattern: an actor group and a rollout group, each its own world 0..1,
    # plus a trainer rank whose child started an inference engine in a third world
    spec = ("driver", [], {}, [_leaf("actor0"), _leaf("actor1"), _leaf("rollout0"),
                               _leaf("rollout1")])
    root, pids = _tree_of(tmp_path, spec)
    try:
        actor = lambda r: RankClaim("process group", r, None, 2, "127.0.0.1:30001")
        rollout = lambda r: RankClaim("process group", r, None, 2, "127.0.0.1:30002")
        finder = RankFinder()
        # WHEN only the actors have joined their world: their own ranks
        first = {"actor0": actor(0), "actor1": actor(1)}
        assert _ranks_of(root, pids, first, finder) == [(0, "actor0", "process group", None),
                                                        (1, "actor1", "process group", None)]
        # THEN the rollout world's ranks take the numbers after the actors', each with its rank
        both = {**first, "rollout0": rollout(0), "rollout1": rollout(1)}
        assert _ranks_of(root, pids, both, finder) == [
            (0, "actor0", "process group", 0), (1, "actor1", "process group", 1),
            (2, "rollout0", "process group", 0), (3, "rollout1", "process group", 1)]
        # and a fresh finder that sees the rollout world first numbers it first: by first sight
        assert [r[1] for r in _ranks_of(root, pids, {"rollout1": rollout(1)})] == ["rollout1"]
    finally:
        _kill(root)


def test_a_world_whose_ranks_claim_late_keeps_the_numbers_its_processes_had(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN verl's layout under load: the rollout workers (RANK 0, 1 in their environment from
    # the start) are numbered first; the actor world joins its group before they join theirs
    spec = ("driver", [], {}, [_leaf(n) for n in ("rollout0", "rollout1", "rollout2",
                                                  "actor0", "actor1")])
    root, pids = _tree_of(tmp_path, spec)
    try:
        finder = RankFinder()
        env = {f"rollout{r}": RankClaim("RANK", r, r, 3) for r in range(3)}
        assert [r[:2] for r in _ranks_of(root, pids, env, finder)] == [
            (0, "rollout0"), (1, "rollout1"), (2, "rollout2")]
        actor = {f"actor{r}": RankClaim("process group", r, None, 2, "10.0.0.1:30001")
                 for r in range(2)}
        # WHEN the actors claim ranks 0, 1 of their world: numbers no live process holds
        ranks = _ranks_of(root, pids, {**env, **actor}, finder)
        assert [r[:2] for r in ranks] == [(0, "rollout0"), (1, "rollout1"), (2, "rollout2"),
                                          (3, "actor0"), (4, "actor1")]
        # THEN once the rollout workers join their own world, every process keeps its number
        rollout = {f"rollout{r}": RankClaim("process group", r, r, 3, "10.0.0.1:30002")
                   for r in range(3)}
        ranks = _ranks_of(root, pids, {**rollout, **actor}, finder)
        assert [r[:2] for r in ranks] == [(0, "rollout0"), (1, "rollout1"), (2, "rollout2"),
                                          (3, "actor0"), (4, "actor1")]
        assert [r[3] for r in ranks] == [0, 1, 2, 0, 1]
        # and when the actors have ended, the rollout ranks still say their world's rank
        rest = _ranks_of(root, pids, rollout, finder)
        assert [(r[0], r[3]) for r in rest] == [(0, 0), (1, 1), (2, 2)]
    finally:
        _kill(root)


def test_ranks_of_two_worlds_ending_together_keep_their_numbers(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN verl's two groups, actors 0..2 and rollout 0..1, numbered 0..4
    spec = ("driver", [], {}, [_leaf(n) for n in ("actor0", "actor1", "actor2", "rollout0",
                                                  "rollout1")])
    root, pids = _tree_of(tmp_path, spec)
    try:
        finder = RankFinder()
        actor = {f"actor{r}": RankClaim("process group", r, None, 3, "127.0.0.1:30001")
                 for r in range(3)}
        rollout = {f"rollout{r}": RankClaim("process group", r, None, 2, "127.0.0.1:30002")
                   for r in range(2)}
        numbered = [r[:2] for r in _ranks_of(root, pids, {**actor, **rollout}, finder)]
        assert numbered == [(0, "actor0"), (1, "actor1"), (2, "actor2"), (3, "rollout0"),
                            (4, "rollout1")]
        # WHEN at the driver's shutdown actor 1 and rollout 1 exit and are not reaped yet
        # (zombies): actor 1's agent file is gone already, rollout 1's still claims its rank
        for name in ("actor1", "rollout1"):
            psutil.Process(pids[name]).kill()
        _wait_gone(pids["actor1"], pids["rollout1"])
        del actor["actor1"]
        ranks = _ranks_of(root, pids, {**actor, **rollout}, finder)
        # THEN rollout 1 is still number 4, not the number actor 1 left
        assert [r[:2] for r in ranks] == [(0, "actor0"), (2, "actor2"), (3, "rollout0"),
                                          (4, "rollout1")]
    finally:
        _kill(root)


def test_a_rank_child_that_inherited_its_rank_is_its_worker_through_a_shell(tmp_path):
    from stalldoc.model.ranks import RankClaim
    # GIVEN a rank (RANK=1 at start, then its group) whose reward server runs under `sh -c`,
    # started with the rank's environment (RANK=1), and a rank child that joined another world
    spec = ("launcher", [], {}, [("rank1", [], {"RANK": "1"}, [
        ("shell", [], {}, [_leaf("reward_server")]), _leaf("engine")])])
    root, pids = _tree_of(tmp_path, spec)
    try:
        claims = {"rank1": RankClaim("process group", 1, None, 2, "127.0.0.1:30001"),
                  "reward_server": RankClaim("RANK", 1),
                  "engine": RankClaim("process group", 0, None, 1, "127.0.0.1:30009")}
        # THEN the reward server (RANK 1 inherited, below a shell) is the rank's worker, and
        # the engine, rank 0 of a world of its own, is a rank of that world
        ranks = _ranks_of(root, pids, claims)
        assert sorted(r[1] for r in ranks) == ["engine", "rank1"]
        assert {r[1]: r[3] for r in ranks} == {"rank1": 1, "engine": 0}
        assert len({r[0] for r in ranks}) == 2
    finally:
        _kill(root)


def _wait_gone(*pids: int) -> None:
    """Until ``pids`` are gone from the process table (their parent reaped them)."""
    deadline = time.time() + 10
    while any(pid in scan() and not scan().procs[pid].dead for pid in pids) \
            and time.time() < deadline:
        time.sleep(0.05)


def _kill(root: subprocess.Popen) -> None:
    for proc in reversed([psutil.Process(root.pid), *psutil.Process(root.pid).children(True)]):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    root.wait()


# Lightning's own launcher, without Lightning: the command re-runs itself once per extra local
# rank with LOCAL_RANK, NODE_RANK, WORLD_SIZE and MASTER_PORT (no RANK); local rank 1 forks a
# dataloader-like worker. argv: local ranks to start (e.g. "1,2").
LIGHTNING_LIKE = """\
import os, subprocess, sys, time
if "LOCAL_RANK" not in os.environ:
    for local in [int(x) for x in sys.argv[1].split(",") if x]:
        subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "LOCAL_RANK": str(local),
                         "NODE_RANK": os.environ["NODE"], "WORLD_SIZE": os.environ["WORLD"],
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"})
elif os.environ["LOCAL_RANK"] == "1" and os.fork() == 0:
    time.sleep(60)
time.sleep(60)
"""


def _lightning_like(tmp_path, locals_: str, node: int, world: int):
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_LIKE)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    root = subprocess.Popen([sys.executable, str(script), locals_],
                            env={**env, "NODE": str(node), "WORLD": str(world)})
    # its children, and the worker local rank 1 forks
    expected = len(locals_.split(",")) + (1 if "1" in locals_.split(",") else 0)
    return root, _tree(root, expected)


def test_lightnings_launcher_tree_claims_global_ranks_node_rank_times_n_plus_local(tmp_path):
    # GIVEN node 1 of a job of 6 (3 per node): the command, its local ranks 1 and 2, and a
    # worker forked by local rank 1 (it inherited LOCAL_RANK=1)
    root, procs = _lightning_like(tmp_path, "1,2", node=1, world=6)
    try:
        by_pid = {r.pid: (r.rank, r.local_rank, r.source) for r in find_ranks(procs)}
        children = {p.pid: int(p.environ()["LOCAL_RANK"]) for p in procs[1:]
                    if p.ppid() == root.pid}
        # THEN the command is global rank 3 (1 * 3 + 0), its children 4 and 5; the worker none
        assert by_pid == {root.pid: (3, 0, "Lightning"),
                          **{pid: (3 + local, local, "Lightning")
                             for pid, local in children.items()}}
    finally:
        _kill(root)


def test_an_incomplete_or_foreign_lightning_tree_claims_nothing(tmp_path):
    # GIVEN local rank 2 started but not local rank 1 (the launcher is still starting them):
    # no guess of which global rank anyone is, the single-process guess stands (rank 0)
    root, procs = _lightning_like(tmp_path, "2", node=0, world=3)
    try:
        assert [(r.rank, r.pid, r.from_env) for r in find_ranks(procs)] == [(0, root.pid, False)]
        assert find_ranks(procs, single=False) == []
    finally:
        _kill(root)
    # AND a tree whose WORLD_SIZE its size does not divide is another layout: no claim
    root, procs = _lightning_like(tmp_path, "1", node=0, world=3)
    try:
        assert find_ranks(procs, single=False) == []
    finally:
        _kill(root)


# the user's program: starts a detached Python helper, prints its own pid and the helper's
TRAIN_WITH_HELPER = ("import os, subprocess, sys, time\n"
                     "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
                     " start_new_session=True)\n"
                     "print(os.getpid(), h.pid, flush=True)\n"
                     "time.sleep(60)")
# an environment runner as conda's entry point is one: a Python script named conda that runs
# the program through a shell that stays (``conda run`` writes a script and runs it with bash)
CONDA = ("import subprocess, sys\n"
         "assert sys.argv[1] == 'run'\n"
         "subprocess.run(['sh', '-c', sys.argv[-1] + '; true'])")


def test_a_single_process_is_the_users_program_not_its_runner_nor_its_helper(tmp_path):
    # GIVEN `conda run -n rl python train.py --deepspeed ds_zero3.json` (no RANK anywhere):
    # conda (Python), a shell, the program, and a Python helper the program started
    (tmp_path / "bin").mkdir()
    conda = tmp_path / "bin" / "conda"
    conda.write_text(CONDA)
    train = tmp_path / "train.py"
    train.write_text(TRAIN_WITH_HELPER)
    program = f"{sys.executable} {train} --deepspeed ds_zero3.json"
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    job = subprocess.Popen([sys.executable, str(conda), "run", "-n", "rl", program],
                           stdout=subprocess.PIPE, text=True, env=env)
    train_pid, helper = (int(pid) for pid in job.stdout.readline().split())
    try:
        procs = _tree(job, 4)
        assert helper in {p.pid for p in procs}
        # THEN rank 0 is the program: not the runner above it, not the helper below it
        assert [(r.rank, r.pid, r.from_env) for r in find_ranks(procs)] == [(0, train_pid, False)]
    finally:
        _end(job, [helper, *(p.pid for p in reversed(_tree(job, 0)[1:]))])


def test_a_command_whose_line_cannot_be_read_is_no_guessed_rank(tmp_path):
    # GIVEN `trl grpo` (a launcher: its program is its child) that has exited, its program with
    # it, and is not reaped yet: a zombie, whose command line reads empty
    trl = tmp_path / "trl"
    trl.write_text("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'])\n")
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    job = subprocess.Popen([sys.executable, str(trl), "grpo", "--use_cpu", "true"], env=env)
    try:
        deadline = time.time() + 20
        while psutil.Process(job.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.time() < deadline
            time.sleep(0.05)
        # THEN nothing is guessed: the zombie is neither the launcher it was nor a rank
        assert find_ranks([psutil.Process(job.pid)]) == []
    finally:
        job.wait()


def _engines_of(root, pids, claims, single):
    """The finder's ranks and engine processes (by name) for the tree, given its agents' claims."""
    from stalldoc.run.job import JobTree
    table = scan()
    found = RankFinder().find(table, JobTree(root.pid, os.getpid()).pids(table), (),
                              single=single, root=root.pid,
                              claims={pids[name]: claim for name, claim in claims.items()})
    by_pid = {pid: name for name, pid in pids.items()}
    return ([(r.rank, by_pid[r.pid]) for r in found.ranks],
            [(by_pid[e.pid], e.role, e.owner, e.tp_rank) for e in found.engines])


@pytest.mark.parametrize("rank_env", [{}, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}],
                         ids=["one-process", "torchrun-rank"])
def test_a_vllm_engines_processes_are_its_ranks_work_not_ranks(tmp_path, rank_env):
    from stalldoc.model.ranks import RankClaim
    # GIVEN the user's process (a single process, or torchrun's rank 1) that started a vLLM
    # engine core, whose two workers (inheriting its environment) joined the engine's own
    # TP world: their agents claim "vLLM engine" ranks 0 and 1
    spec = ("user", [], rank_env, [("core", [], {}, [_leaf("tp0"), _leaf("tp1")])])
    root, pids = _tree_of(tmp_path, spec)
    claims = {f"tp{n}": RankClaim("vLLM engine", n, None, 2, "127.0.0.1:41000") for n in (0, 1)}
    if rank_env:
        claims["user"] = RankClaim("process group", 1, 1, 2, "127.0.0.1:29500")
    try:
        ranks, engines = _engines_of(root, pids, claims, single=not rank_env)
        # THEN the user's process is the rank, and the engine core and workers are its engine
        number = 1 if rank_env else 0
        assert ranks == [(number, "user")]
        assert sorted(engines) == [("core", "engine core", number, None),
                                   ("tp0", "worker", number, 0), ("tp1", "worker", number, 1)]
    finally:
        _kill(root)


def test_engine_processes_are_titled_as_a_user_knows_them():
    from stalldoc.model.ranks import EngineProcess
    assert EngineProcess(7, "worker", 0, 1, 2).title == "vLLM worker (TP rank 1) of rank 0's engine"
    assert EngineProcess(8, "engine core", 3).title == "rank 3's vLLM engine core"
    assert EngineProcess(9, "engine core").title == "the vLLM engine core"
    assert EngineProcess(9, "worker").title == "vLLM worker of its engine"


def test_a_single_process_in_its_exit_is_still_rank_zero(monkeypatch):
    # GIVEN a job's single process, found as its rank 0
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        finder = RankFinder()
        table = scan()
        [rank] = finder.find(table, [proc.pid], (), single=True, root=proc.pid).ranks
        # WHEN it exits: its memory released before it is a zombie, as /proc showed a real 3 GB
        # process for a moment (running, no resident pages, argv and stack addresses 0), with an
        # empty command line and environment (what reading them then gives)
        info = table.procs[proc.pid]
        exiting = dataclasses.replace(info, rss_bytes=0, exec_key=(0,) * len(info.exec_key))
        assert exiting.released and not info.released
        monkeypatch.setattr(process_tree, "read_launch",
                            lambda pid: Launch(None, None, 0, False, (), None, None))
        found = finder.find(dataclasses.replace(table, procs={**table.procs, proc.pid: exiting}),
                            [proc.pid], (), single=True, root=proc.pid)
        # THEN it is still the job's rank 0 (it was dropped as "not rank 0", and a server's
        # clean exit left a report without ranks)
        assert [(r.rank, r.pid) for r in found.ranks] == [(0, proc.pid)] == [(rank.rank,
                                                                               rank.pid)]
    finally:
        proc.kill()
        proc.wait()
