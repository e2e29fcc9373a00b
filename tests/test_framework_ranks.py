"""Frameworks that start their own ranks, run as users start them (``python train.py``, ``fabric
run``): Lightning DDP and a Fabric loop on the CPU, Ray Train's TorchTrainer, and a Ray job of
two worker groups that form two gloo worlds (verl's layout). Healthy: the job's exit code, no
stall, exactly the global ranks, one process each, none a launcher or one of Ray's processes.
Hung: the right rank (and world) and frame within stall timeout + 5 s. Healthy runs under a CPU
burner; each hang once, on an idle machine or under the burner."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from load import cpu_burner
from support import (SCENARIOS, STALL_TIMEOUT, Result, free_port, start_watch,
                     trickle_storage, watch)
from test_launcher_ranks import job_pid

pytestmark = pytest.mark.timeout(420)
DIAGNOSIS_WITHIN = float(STALL_TIMEOUT) + 5
# Each scenario runs once: a healthy run with both cores busy (where a false stall would come
# from), a hang on an idle machine or under load, both loads among the hangs (a run per load
# and scenario cost minutes of the suite and named nothing new)
LOADED = pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])
IDLE = pytest.mark.parametrize("loaded", [False], ids=["idle"])


def run(tmp_path: Path, script: str, env: dict[str, str], loaded: bool, *options: str
        ) -> Result:
    with cpu_burner(2 if loaded else 0):
        return watch(tmp_path, [sys.executable, str(SCENARIOS / script)], *options, env=env,
                     timeout=360)


def assert_healthy(result: Result, world: int) -> list[dict[str, Any]]:
    """Exit 0, no stall and no error, exactly ranks 0..world-1 once each, known from their
    process group; not the job's own process, not one of Ray's. A job that did its work and
    then hit torch's own exit race (a gloo thread taking the GIL as Python finalizes: SIGABRT,
    exit 134; pytorch issue 190489, seen in CI for Lightning's ranks under load) is healthy
    when watch names it so: SD115, a warning, never an error."""
    report = result.report()
    if result.code != 0:
        raced = [f for f in report["findings"] if f["code"] == "SD115"
                 and "killed by SIGABRT at interpreter exit, after the work was done"
                 in f["summary"]]
        assert result.code == 134 and raced, result.stderr[-3000:]
    assert report["stalls"] == [], result.stderr[-3000:]
    assert [f["summary"] for f in report["findings"]
            if f["severity"] in ("error", "critical")] == []
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(world)), ranks
    assert len({r["pid"] for r in ranks}) == world
    assert {r["source"] for r in ranks} == {"process group"}, ranks
    return ranks


def assert_culprit(result: Result, rank: int, func: str) -> dict[str, Any]:
    assert result.code == 124, result.stderr[-3000:]
    findings = result.report()["findings"]
    sd101 = [f for f in findings if f["code"] == "SD101"]
    assert len(sd101) == 1, ([f["summary"] for f in findings], result.stderr[-4000:])
    [finding] = sd101
    assert finding["ranks"] == [rank], (finding["summary"], result.stderr[-4000:])
    assert finding["evidence"]["frame"].startswith(f"{func} ("), finding["summary"]
    report = result.report()
    [stall] = report["stalls"]
    assert finding["t"] - stall["started_at"] <= DIAGNOSIS_WITHIN, (finding["t"], stall)
    return report


# ----- Lightning ---------------------------------------------------------------------------
@LOADED
def test_lightning_ddp_healthy_has_both_ranks(tmp_path: Path, loaded: bool) -> None:
    pytest.importorskip("lightning")
    # GIVEN Trainer(devices=2, strategy="ddp") started as `python train.py`: the process the
    # user started is global rank 0 and starts rank 1 itself (no RANK anywhere)
    result = run(tmp_path, "lightning_ddp.py", {"DEVICES": "2", "STEPS": "6"}, loaded)
    ranks = assert_healthy(result, 2)
    # THEN the command's own process is rank 0, and its child rank 1
    assert {r["rank"]: r["pid"] for r in ranks}[0] == job_pid(result)


@IDLE
def test_lightning_ddp_hung_rank_is_named(tmp_path: Path, loaded: bool) -> None:
    pytest.importorskip("lightning")
    # GIVEN 3 devices, global rank 2 stuck inside training_step, the others in DDP's all-reduce
    env = {"DEVICES": "3", "STEPS": "40", "STUCK_RANK": "2", "STUCK_FUNC": "decode_images"}
    result = run(tmp_path, "lightning_ddp.py", env, loaded, "--on-stall", "kill")
    report = assert_culprit(result, 2, "decode_images")
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2]


def run_fabric(tmp_path: Path, devices: int, env: dict[str, str], loaded: bool, *options: str
               ) -> Result:
    """``fabric run --accelerator=cpu --strategy=ddp --devices=N fabric_loop.py``: Fabric's CLI
    (a console script beside the interpreter) runs torchrun inside its own process."""
    fabric = [str(Path(sys.executable).parent / "fabric"), "run", "--accelerator=cpu",
              "--strategy=ddp", f"--devices={devices}", f"--main-port={free_port()}",
              str(SCENARIOS / "fabric_loop.py")]
    with cpu_burner(2 if loaded else 0):
        return watch(tmp_path, fabric, *options, env=env, timeout=360)


@LOADED
def test_fabric_run_healthy_ranks_are_its_workers_never_the_cli(tmp_path: Path,
                                                                 loaded: bool) -> None:
    pytest.importorskip("lightning")
    # GIVEN a Fabric loop on 2 CPU devices started with Fabric's own launcher, `fabric run`
    result = run_fabric(tmp_path, 2, {"STEPS": "6"}, loaded)
    ranks = assert_healthy(result, 2)
    # THEN the ranks are torchrun's workers; the CLI's process, which runs torchrun inside it,
    # is a launcher: never a rank, not even a guessed one before the workers joined
    assert job_pid(result) not in {r["pid"] for r in ranks}
    assert "a single process" not in result.stderr, result.stderr[-3000:]
    assert f"pid {job_pid(result)} is not rank 0" not in result.stderr


@IDLE   # healthy: under load
def test_fabric_run_hung_rank_is_named(tmp_path: Path, loaded: bool) -> None:
    pytest.importorskip("lightning")
    # GIVEN 3 devices under `fabric run`, rank 1 stuck before its backward pass, the others in
    # DDP's gradient all-reduce
    env = {"STEPS": "40", "STUCK_RANK": "1", "STUCK_FUNC": "fetch_remote_batch"}
    result = run_fabric(tmp_path, 3, env, loaded, "--on-stall", "kill")
    # THEN rank 1 and its frame are named, and no other process is a rank
    report = assert_culprit(result, 1, "fetch_remote_batch")
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2]
    assert job_pid(result) not in {r["pid"] for r in report["ranks"]}


# ----- Ray Train ---------------------------------------------------------------------------
# under load only: on an idle machine the worker-group restart test below finds the same ranks
# (the train workers, never the driver) in both attempts
@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])
def test_ray_train_healthy_ranks_are_the_train_workers(tmp_path: Path, ray_env: dict[str, str],
                                                       loaded: bool) -> None:
    # GIVEN TorchTrainer(num_workers=3) started as `python driver.py`, watched with the kill
    # action armed (a false stall would end a healthy run)
    env = {**ray_env, "WORKERS": "3", "STEPS": "6"}
    result = run(tmp_path, "ray_train_ddp.py", env, loaded, "--on-stall", "kill")
    ranks = assert_healthy(result, 3)
    # THEN the ranks are not the driver, and not any of Ray's own processes
    assert job_pid(result) not in {r["pid"] for r in ranks}
    assert f"pid {job_pid(result)} is not rank 0" in result.stderr


@pytest.mark.parametrize("loaded,in_memory", [(True, False), (False, True)],
                         ids=["to-disk-cpu-burner", "into-memory"])
def test_a_ray_driver_waiting_on_its_tasks_is_no_stalled_rank(tmp_path: Path,
                                                              ray_env: dict[str, str],
                                                              loaded: bool,
                                                              in_memory: bool) -> None:
    # GIVEN `python prepare.py`: ray.init(), then the driver waits in ray.get while two Ray
    # tasks pull 3 MiB checkpoint shards from remote storage at 256 KiB/s, 12 s (no CPU, no
    # process group: nothing is a rank), to disk with both cores busy, or into memory (no
    # byte of it in rchar or wchar), watched with a 3 s stall timeout and the kill armed
    with trickle_storage(3 << 20, 256 << 10) as storage:
        result = run(tmp_path, "ray_prepare.py", {**ray_env, "STORAGE_URL": storage.url,
                                                  "IN_MEMORY": "1" if in_memory else "0"},
                     loaded, "--on-stall", "kill")
    # THEN the run ends as it would have, no stall: the driver is taken for rank 0 only until
    # it started its Ray node; then the job is its driver and its tasks, and the tasks' reads
    # are its work
    assert result.code == 0, result.stderr[-3000:]
    assert f"fetched 2 shards ({2 * (3 << 20)} bytes)" in result.stdout
    report = result.report()
    assert report["stalls"] == [] and report["ranks"] == [], result.stderr[-3000:]
    if f"rank 0: pid {job_pid(result)}" in result.stderr:   # seen before ray.init (usually)
        assert f"pid {job_pid(result)} is not rank 0" in result.stderr


def test_a_ray_download_that_stalls_is_named_in_its_task(tmp_path: Path,
                                                         ray_env: dict[str, str]) -> None:
    # GIVEN the same preparation, where storage stops sending shard 1 after 512 KiB and keeps
    # the connection open (no timeout in the client, as in hub downloads that hang at a %)
    with trickle_storage(3 << 20, 256 << 10, {"shard-1": 512 << 10}) as storage:
        result = run(tmp_path, "ray_prepare.py", {**ray_env, "STORAGE_URL": storage.url},
                     False, "--on-stall", "kill")
        held = storage.held_at.get("shard-1")
    assert result.code == 124 and held is not None, result.stderr[-3000:]
    # THEN once nothing in the job has worked for the stall timeout, the job is stalled: no
    # rank is named (none exists), and the job is said to wait in the task's socket read, at
    # the task's own frame, on the storage's address
    report = result.report()
    [stall] = report["stalls"]
    assert stall["ranks"] == [] and stall["started_at"] >= held - 1, (stall, held)
    [finding] = result.findings("SD120")
    assert finding["ranks"] == [] and "none of its processes is a rank" in finding["summary"]
    [call] = [c for c in finding["evidence"]["calls"] if c["call"] == "fetch_checkpoint_shard"]
    assert call["kind"].startswith("waiting: ") and call["frame"].startswith(
        "fetch_checkpoint_shard (") and "ray_prepare.py" in call["frame"], call
    assert storage.url.removeprefix("http://") in call["peers"], call
    assert f"fetch_checkpoint_shard (pid {call['pid']}" in finding["summary"], finding["summary"]
    assert [b["pid"] for b in finding["evidence"]["blamed"]] == [call["pid"]], finding
    # AND the driver's agent listed the processes Ray started for its node (none of them the
    # driver or a worker of the job): their CPU is Ray's, not the job's
    driver = finding["evidence"]["driver"]["pid"]
    facts = json.loads((result.run_dir / "agents" / f"ray-{driver}.json").read_text())
    daemons = {int(p) for p in facts["daemons"].split(",")}
    assert len(daemons) >= 4 and not daemons & {driver, call["pid"]}, facts


def test_a_ray_job_whose_gpus_never_come_is_named_with_what_it_asks(tmp_path: Path,
                                                                    ray_env: dict[str, str]
                                                                    ) -> None:
    # GIVEN verl's driver waiting for its rollout worker group's placement group, 2 bundles of
    # one GPU each, on a node whose Ray has no GPU (the driver gives up after 15 s), no
    # dashboard (no state API); no kill armed: Ray's autoscaler says why only seconds in (under
    # load, after a 3 s stall was declared, and a kill then raced its line)
    result = run(tmp_path, "ray_unschedulable.py", {**ray_env, "WAIT_SECONDS": "15"}, False)
    assert result.code == 1 and "was not placed in" in result.stdout, result.stderr[-3000:]
    # THEN Ray's autoscaler line is read as a request no node can hold, said while it waited:
    # what it asks for, and the fix; no rank is named (the driver waits, Ray's workers never
    # started)
    report = result.report()
    [finding] = result.findings("SD534")
    assert finding["severity"] == "error" and finding["ranks"] == [], finding
    evidence = finding["evidence"]
    assert evidence["kind"] == "infeasible" and "'GPU': 2.0" in evidence["request"], evidence
    assert "\x1b" not in evidence["last_line"], evidence["last_line"]   # Ray's colours: words
    assert "[SD534 error] Ray cannot schedule {" in result.stderr
    # AND since Ray says no node type of the cluster can hold it (no node is coming) and
    # nothing of the job works, the job is stalled: no rank, the driver's wait named
    [stall] = report["stalls"]
    assert stall["ranks"] == [] and report["ranks"] == [], result.stderr[-3000:]
    [waits] = result.findings("SD120")
    assert re.search(r"the driver \(pid \d+\) waits on ray\.get at main \(\S+"
                     r"ray_unschedulable\.py:\d+\)", waits["summary"]), waits["summary"]
    assert sorted(f["code"] for f in report["findings"]) == ["SD120", "SD534"], \
        report["findings"]
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)


def test_two_worlds_a_worker_killed_like_the_oom_killer_does_is_named_with_its_actor(
        tmp_path: Path, ray_env: dict[str, str]) -> None:
    # GIVEN verl's layout, the rollout group's rank 1 killed at its step 1 (SIGKILL, as the OOM
    # killer ends a worker): its actor is dead, the driver's ray.get fails
    env, ports = two_worlds(ray_env, STUCK_GROUP="rollout", STUCK_RANK="1", STUCK_HOW="killed")
    result = run(tmp_path, "ray_two_worlds.py", env, False, "--on-stall", "kill")
    assert result.code == 1, result.stderr[-3000:]
    # THEN Ray's own lines name the dead worker, and it is the rank whose process it was
    report = result.report()
    [killed] = [r for r in report["ranks"]
                if (r["world"], r["world_rank"]) == (ports["rollout"], 1)]
    [died] = result.findings("SD532")
    assert died["ranks"] == [killed["rank"]] and died["severity"] == "critical", died
    assert died["summary"].startswith(f"rank {killed['rank']}: ") and (
        f"pid {killed['pid']}" in died["summary"]), died["summary"]
    assert "SYSTEM_ERROR" in died["summary"]
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)
    assert report["stalls"] == []   # it died: nothing hung


def test_ray_train_worker_group_restarted_after_a_failure_its_hang_is_named_in_attempt_2(
        tmp_path: Path, ray_env: dict[str, str]) -> None:
    # GIVEN FailureConfig(max_failures=1): rank 1 of 2 raises at step 1 ("corrupt shard"), Ray
    # Train ends the worker group and starts a new one (new actor processes), in which rank 1
    # blocks in its prompt fetch at step 2 while rank 0 waits in DDP's all-reduce
    env = {**ray_env, "WORKERS": "2", "STEPS": "40", "FAIL_RANK": "1", "MAX_FAILURES": "1",
           "STUCK_RANK": "1", "STUCK_AFTER_FAILURE": "1", "STUCK_FUNC": "fetch_prompts"}
    result = run(tmp_path, "ray_train_ddp.py", env, False, "--on-stall", "kill")
    # THEN the new group's processes are the ranks, the hang is theirs, named at its frame: the
    # training thread Ray Train runs the loop in, not the worker's main thread in Ray's main_loop
    report = assert_culprit(result, 1, "fetch_prompts")
    pids = {rank: sorted((r for r in report["ranks"] if r["rank"] == rank),
                         key=lambda r: r["first_seen"]) for rank in (0, 1)}
    assert all(len(p) == 2 for p in pids.values()), report["ranks"]
    # AND it is said to be in the second attempt, the watch having said when that began
    [culprit] = result.findings("SD101")
    assert culprit["summary"].startswith("attempt 2: ") and culprit["evidence"]["attempt"] == 2
    assert "attempt 2: the ranks run again, in new processes" in result.stderr
    # AND the first attempt's failure, which Ray caught in the worker (no process died of
    # it), is told from Ray Train's own lines: the rank, its exception, the restart
    [failed] = result.findings("SD531")
    assert failed["ranks"] == [1] and failed["severity"] == "warning", failed
    assert "RuntimeError: corrupt shard: rank 1 read 0 of 4096 bytes at step 1" in failed[
        "summary"] and "starts it again" in failed["summary"], failed


def test_ray_train_report_made_by_rank_0_alone_names_the_ranks_that_skipped_it(
        tmp_path: Path, ray_env: dict[str, str]) -> None:
    # GIVEN TorchTrainer(num_workers=3) whose loop reports a checkpoint after every 3rd step on
    # rank 0 only (ray#38958 without its else): rank 0 waits in report's barrier of every
    # worker, ranks 1 and 2 go on to the next step and wait in DDP's all-reduce for rank 0
    env = {**ray_env, "WORKERS": "3", "STEPS": "40", "REPORT_EVERY": "3", "REPORT_RANKS": "0"}
    result = run(tmp_path, "ray_train_ddp.py", env, False, "--on-stall", "kill")
    assert result.code == 124, result.stderr[-3000:]
    # THEN the ranks named are those that skipped the report, at their own frame, not rank 0,
    # which is outside the all-reduce only because it waits in Ray Train's barrier for them
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [1, 2], finding["summary"]
    assert finding["evidence"]["frame"].startswith("train_loop_per_worker ("), finding["evidence"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "train_barrier_skipped" and cause["call"] == "ray.train.report"
    assert cause["barrier_ranks"] == [0] and cause["skipped_ranks"] == [1, 2], cause
    assert cause["barrier_frame"].startswith("report_checkpoint ("), cause
    assert "ranks 1, 2 never joined" in finding["summary"], finding["summary"]
    assert "checkpoint=None" in finding["fix"], finding["fix"]


# ----- two worlds in one Ray job (verl's layout) --------------------------------------------
def two_worlds(ray_env: dict[str, str], **extra: str) -> tuple[dict[str, str], dict[str, str]]:
    ports = {"actor": f"127.0.0.1:{free_port()}", "rollout": f"127.0.0.1:{free_port()}"}
    env = {**ray_env, "ACTOR_PORT": ports["actor"].split(":")[1],
           "ROLLOUT_PORT": ports["rollout"].split(":")[1], **extra}
    return env, ports


@LOADED
def test_two_worlds_healthy_every_rank_of_both(tmp_path: Path, ray_env: dict[str, str],
                                               loaded: bool) -> None:
    # GIVEN an actor group of 2 and a rollout group of 3, each its own gloo world 0..N-1, whose
    # workers end with status 1 as the driver shuts down (as Ray's often do)
    env, ports = two_worlds(ray_env, ACTOR_RANKS="2", ROLLOUT_RANKS="3", STEPS="4",
                            EXIT_1_AT_SHUTDOWN="1")
    result = run(tmp_path, "ray_two_worlds.py", env, loaded, "--on-stall", "kill")
    ranks = assert_healthy(result, 5)
    # THEN each (world, rank) is there once, under its own number; their exit is no failure:
    # a status 1 seen (it races the raylet reaping the worker) is the driver's shutdown (the
    # job exited 0: the exit's source says so, nothing is judged) or a rank that ended after
    # leaving its world (SD115, a warning), never a dead rank. (CI saw the first once: rank 0's
    # status 1 read before the raylet reaped it, recorded as "driver shutdown".)
    findings = result.report()["findings"]
    assert [f["summary"] for f in findings if f["code"] == "SD103"] == []
    ended_1 = {r["rank"] for r in ranks if r["exit_code"] == 1}
    left = {rank for f in findings if f["code"] == "SD115" for rank in f["ranks"]}
    shutdown = {r["rank"] for r in ranks if r["exit_source"] == "driver shutdown"}
    assert ended_1 == left | shutdown and not left & shutdown
    assert all("exited with status 1 after destroy_process_group" in f["summary"]
               for f in findings if f["code"] == "SD115")
    assert sorted((r["world"], r["world_rank"]) for r in ranks) == sorted(
        [(ports["actor"], n) for n in range(2)] + [(ports["rollout"], n) for n in range(3)])


# each world's hang once, one idle and one with both cores busy (each load is also run for
# the healthy job): the four crossings cost 80 s of the suite's hour and named nothing new
@pytest.mark.parametrize("group,stuck,loaded", [("actor", 1, False), ("rollout", 0, False)],
                         ids=["actor-1-idle", "rollout-0-idle"])   # healthy: under load
def test_two_worlds_hung_rank_is_named_with_its_world(tmp_path: Path, ray_env: dict[str, str],
                                                      loaded: bool, group: str,
                                                      stuck: int) -> None:
    env, ports = two_worlds(ray_env, STEPS="40", STUCK_GROUP=group, STUCK_RANK=str(stuck),
                            STUCK_FUNC="score_rollouts")
    result = run(tmp_path, "ray_two_worlds.py", env, loaded, "--on-stall", "kill")
    report = result.report() if result.code == 124 else {"ranks": []}
    number = {(r["world"], r["world_rank"]): r["rank"] for r in report["ranks"]}
    # THEN the culprit is that world's rank, named with its frame, in its world's group
    finding = assert_culprit(result, number.get((ports[group], stuck), -1), "score_rollouts")
    [sd101] = [f for f in finding["findings"] if f["code"] == "SD101"]
    assert f"@{ports[group]}" in sd101["summary"]


# ----- A Ray cluster started apart (`ray start` on each node) --------------------------------
@contextlib.contextmanager
def watched_ray_node(tmp_path: Path, ray_env: dict[str, str], *options: str
                     ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`stalldoc watch OPTIONS -- ray start --head --block`: the form docs/launchers.md gives for a Ray
    cluster started apart (one per node, a run directory each). Yields the watcher and the
    cluster's address once the node is up; the watcher is ended with SIGINT (Ctrl-C) at the
    end if it still runs."""
    port = free_port()
    ray = str(Path(sys.executable).parent / "ray")
    log = tmp_path / "node.log"
    with open(log, "w") as sink:
        node = start_watch(tmp_path / "run", [
            ray, "start", "--head", "--block", "--port", str(port), "--num-cpus", "4",
            "--include-dashboard", "false"], *options,
            env=ray_env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while "block forever" not in log.read_text():
            assert node.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield node, f"127.0.0.1:{port}"
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGINT)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()


def node_result(node: subprocess.Popen[str], tmp_path: Path) -> Result:
    return Result(node.returncode, (tmp_path / "node.log").read_text(), tmp_path / "run")


def test_ray_cluster_started_apart_hung_rank_is_named(tmp_path: Path,
                                                      ray_env: dict[str, str]) -> None:
    # GIVEN `ray start --head --block` watched with the kill action armed, and verl's two
    # worker groups submitted by a driver started apart (RAY_ADDRESS), actor rank 1 stuck
    with watched_ray_node(tmp_path, ray_env, "--on-stall", "kill") as (node, address):
        env, ports = two_worlds({**ray_env, "RAY_ADDRESS": address}, STEPS="40",
                                STUCK_GROUP="actor", STUCK_RANK="1", STUCK_FUNC="score_rollouts")
        driver = subprocess.Popen([sys.executable, str(SCENARIOS / "ray_two_worlds.py")],
                                  env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            node.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    # THEN the node's watcher names that world's rank with its frame and ends the node
    result = node_result(node, tmp_path)
    report = result.report()
    number = {(r["world"], r["world_rank"]): r["rank"] for r in report["ranks"]}
    assert_culprit(result, number.get((ports["actor"], 1), -1), "score_rollouts")


def test_ray_cluster_started_apart_healthy_job_has_its_ranks(tmp_path: Path,
                                                             ray_env: dict[str, str]) -> None:
    # GIVEN the watched node and a healthy two-group job submitted to it, which ends
    with watched_ray_node(tmp_path, ray_env, "--on-stall", "kill") as (node, address):
        env, ports = two_worlds({**ray_env, "RAY_ADDRESS": address}, STEPS="4")
        driver = subprocess.run([sys.executable, str(SCENARIOS / "ray_two_worlds.py")],
                                env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                                capture_output=True, text=True, timeout=300)
        assert driver.returncode == 0, driver.stderr[-3000:]
        time.sleep(3 * float(STALL_TIMEOUT))   # the node idles on, its workers between jobs
        assert node.poll() is None, "the watcher ended a healthy node"
    # THEN (node ended with Ctrl-C) no stall, and both worlds' ranks were found, each once
    result = node_result(node, tmp_path)
    report = result.report()
    assert report["stalls"] == [], result.stderr[-3000:]
    assert sorted((r["world"], r["world_rank"]) for r in report["ranks"]) == sorted(
        [(ports["actor"], n) for n in range(2)] + [(ports["rollout"], n) for n in range(2)])
