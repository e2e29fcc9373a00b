"""The part of a Ray job that is no rank (``sidecar/ray_job.py``), on real Ray: an RL loop whose
driver scores the samples itself, two learners in a gloo world and a generation server actor
(``scenarios/ray_rl_driver.py``). When every learner waits for its next task the job is stalled
only when its driver and its actors do no work either: the weight sync that never completes is
named where it stands (the driver's ``ray.get``, the health check queued behind the actor's
call, that call's own frame), idle and under load; a driver spinning in its normaliser is named
as spinning (a warning, never a stall); a driver that scores for longer than the stall timeout
with its stack moving is work."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from load import cpu_burner
from stalldoc.detect.stack_kind import classify
from stalldoc.model.ray_job import (ACTOR, DRIVER, WORKER, RayPlacementGroup, RayProcess,
                                    RayState)
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.probes.pyspy import StackProbe
from stalldoc.probes.proc_table import scan
from stalldoc.sidecar.ray_job import NO_CPU, RESOURCE_WAIT, RayJob, _place, _Process
from support import (SCENARIOS, Result, end_watched, start_watch, trickle_storage,
                     wait_in_file, watch)

pytestmark = pytest.mark.timeout(420)
STALL = 10


def run(tmp_path: Path, env: dict[str, str], loaded: bool, *options: str) -> Result:
    with cpu_burner(2 if loaded else 0):
        return watch(tmp_path, [sys.executable, str(SCENARIOS / "ray_rl_driver.py")],
                     "--stall-timeout", str(STALL), *options, env=env, timeout=360)


# the loop in the driver, or in a TaskRunner actor the driver waits on (verl's main_ppo); these
# hangs on an idle node: the Ray hang under load is the weight sync's, the healthy Ray loops under
# load are the spinning normaliser's, the scoring driver's and the cluster started apart's
RUNNER = pytest.mark.parametrize("runner", [False, True], ids=["driver", "task-runner"])


def hang_from(result: Result) -> float:
    # the driver's own line, or an actor's as Ray forwards it: "(TaskRunner pid=N) hang ..."
    found = re.search(r"\bhang \w+ from ([\d.]+)$", result.stdout, re.M)
    assert found, result.stdout[-2000:] + result.stderr[-3000:]
    return float(found.group(1))


@pytest.mark.parametrize("loaded,runner", [(False, True),
                                           pytest.param(True, False, marks=pytest.mark.alone)],
                         ids=["idle-task-runner", "loaded"])
def test_a_weight_sync_that_never_completes_is_named_where_the_job_waits(
        tmp_path: Path, ray_env: dict[str, str], loaded: bool, runner: bool) -> None:
    # GIVEN the server's load_weights joining a weight-sync group whose trainer side never
    # comes, the health check queued behind it; the loop run by the driver itself (loaded), or
    # by a TaskRunner actor the driver waits on, as verl's main_ppo does, with two worker groups
    # in worlds of their own, actor and critic (idle); watched with the kill action armed
    env = {**ray_env, "HANG": "weight_sync", "PING_TIMEOUT": "300",
           "TASK_RUNNER": "1" if runner else "0", "CRITICS": "2" if runner else "0"}
    result = run(tmp_path, env, loaded, "--on-stall", "kill")
    report = result.report()
    # THEN the job's stall is declared within twice the stall timeout of the hang
    [stall] = report["stalls"]
    assert stall["detected_at"] - hang_from(result) <= 2 * STALL, (stall, result.stderr[-3000:])
    assert "nothing in the job (its ranks, its driver and actors) showed work" in result.stderr
    # AND it is named where it stands: the driver in ray.get (on the loop's TaskRunner, itself
    # in ray.get at its line), the health check queued behind the server's load_weights, which
    # waits in its rendezvous at its own line
    [finding] = result.findings("SD120")
    # (the two worlds' ranks numbered apart: the learners' and the critics')
    assert finding["severity"] == "error" and finding["ranks"] == (
        [0, 1, 2, 3] if runner else [0, 1]), finding
    summary, evidence = finding["summary"], finding["evidence"]
    loop = "main" if runner else "rl_loop"   # the driver's frame: its wait on the runner, or
    assert re.search(rf"the driver \(pid \d+\) waits on ray\.get at {loop} \(\S+ray_rl_driver"
                     r"\.py:\d+\)", summary), summary   # its own loop's call
    assert "GenerationServer.ping queued behind GenerationServer.load_weights (pid" in summary
    assert re.search(r"waits on collective at GenerationServer\.load_weights \(\S+:\d+\)",
                     summary), summary
    calls = {c["call"]: c for c in evidence["calls"]}
    call = calls["GenerationServer.load_weights"]
    assert call["actor_class"] == "GenerationServer" and call["queued_behind"] == [
        "GenerationServer.ping"], call
    assert any("_create_c10d_store" in f for f in call["frames"]), call["frames"]
    # (the server's call is blamed, the innermost of the chain, in a rendezvous not complete)
    assert [b["pid"] for b in evidence["blamed"]] == [call["pid"]], evidence["blamed"]
    assert evidence["cause"]["kind"] == "rendezvous_incomplete", evidence["cause"]
    assert evidence["frame"].startswith("GenerationServer.load_weights ("), evidence["frame"]
    if runner:
        assert re.search(r"TaskRunner\.run \(pid \d+, running for \d+ s\), waits on ray\.get "
                         r"at rl_loop \(\S+ray_rl_driver\.py:\d+\)", summary), summary
    assert set(calls) == ({"GenerationServer.load_weights", "TaskRunner.run"} if runner
                          else {"GenerationServer.load_weights"}), calls
    assert evidence["ray_state"].startswith("http://"), evidence
    # AND the learners and critics, ranks of their own worlds, are never taken for the job's
    # actors
    assert "actor PolicyLearner" not in result.stderr, result.stderr[-3000:]
    assert "actor ValueCritic" not in result.stderr, result.stderr[-3000:]
    assert sorted(r["rank"] for r in report["ranks"]) == ([0, 1, 2, 3] if runner else [0, 1])


@RUNNER
def test_a_pool_no_node_can_hold_is_named_with_what_it_asks(
        tmp_path: Path, ray_env: dict[str, str], runner: bool) -> None:
    # GIVEN the learners up, and the loop (in the driver, or in a TaskRunner actor)
    # reserving its engines' pool: a placement group of two bundles of 64 CPUs on one node, on
    # a node of 2
    env = {**ray_env, "POOL_CPUS": "64", "GIVE_UP": "300", "TASK_RUNNER": "1" if runner else "0"}
    result = run(tmp_path, env, False, "--on-stall", "kill")
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - hang_from(result) <= 2 * STALL, (stall, result.stderr[-3000:])
    # THEN the job's stall names the driver's wait (on the pool's readiness, or on the
    # TaskRunner, itself waiting there) and the group Ray cannot place, with what it asks and
    # Ray's word for why
    [finding] = result.findings("SD120")
    summary = finding["summary"]
    loop = r"main \(\S+ray_rl_driver\.py:\d+\)" if runner else "reserve_pool"
    assert re.search(rf"the driver \(pid \d+\) waits on ray\.get at {loop}", summary), summary
    if runner:
        assert re.search(r"TaskRunner\.run \(pid \d+, running for \d+ s\), waits on ray\.get "
                         r"at reserve_pool \(\S+ray_rl_driver\.py:\d+\)", summary), summary
    assert "placement group rollout_pool never placed (infeasible): it asks for 2 bundle(s) of " \
        "{'CPU': 64.0}" in summary, summary
    [group] = finding["evidence"]["placement_groups"]
    assert (group["name"], group["state"], group["scheduling"]) == (
        "rollout_pool", "PENDING", "INFEASIBLE"), group
    # AND the process that waits for the group is blamed (the TaskRunner's call, else the
    # driver), for a placement group Ray has not placed
    evidence = finding["evidence"]
    waiting = ([c["pid"] for c in evidence["calls"] if c["call"] == "TaskRunner.run"] if runner
               else [evidence["driver"]["pid"]])
    assert [b["pid"] for b in evidence["blamed"]] == waiting, evidence
    assert evidence["cause"]["kind"] == "placement_group_not_placed", evidence["cause"]


def test_a_server_no_node_can_place_is_named_with_what_it_asks(
        tmp_path: Path, ray_env: dict[str, str]) -> None:
    # GIVEN the loop in a TaskRunner actor, its generation server asking for a GPU on a node
    # without any: the learners are up and wait, the loop's first call to the server waits
    # (under load: the pool's test above, what never fits being a placement group there)
    env = {**ray_env, "SERVER_GPUS": "1", "GIVE_UP": "300", "TASK_RUNNER": "1"}
    result = run(tmp_path, env, False, "--on-stall", "kill")
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - hang_from(result) <= 2 * STALL, (stall, result.stderr[-3000:])
    # THEN the job's stall names the call, the actor never created and what it asks
    [finding] = result.findings("SD120")
    assert re.search(r"GenerationServer\.\w+ waits for its actor GenerationServer, never "
                     r"created: no node can place it yet \(it asks for \{'GPU': 1\.0\}\)",
                     finding["summary"]), finding["summary"]
    [held] = finding["evidence"]["held_by_actors"]
    assert held["state"] == "PENDING_CREATION" and held["actor_class"] == "GenerationServer"
    assert finding["evidence"]["cause"]["kind"] == "actor_not_alive", finding["evidence"]


@RUNNER
def test_a_loop_waiting_on_a_silent_verifier_is_named_with_the_server(
        tmp_path: Path, ray_env: dict[str, str], runner: bool) -> None:
    # GIVEN the loop (in the driver, or in a TaskRunner actor) asking a remote
    # verifier for its rewards with no timeout, the verifier (here: this test) accepting the
    # connection and never answering; kill armed
    with socket.socket() as verifier:
        verifier.bind(("127.0.0.1", 0))
        verifier.listen(8)
        port = verifier.getsockname()[1]
        env = {**ray_env, "HANG": "reward_server", "REWARD_URL": f"http://127.0.0.1:{port}",
               "TASK_RUNNER": "1" if runner else "0"}
        result = run(tmp_path, env, False, "--on-stall", "kill")
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - hang_from(result) <= 2 * STALL, (stall, result.stderr[-3000:])
    # THEN the job's stall names the loop's own call and the server it waits on: the driver's,
    # or the TaskRunner's call (the driver waiting on it)
    [finding] = result.findings("SD120")
    summary, evidence = finding["summary"], finding["evidence"]
    waits = (rf"waits on socket \(a server at 127\.0\.0\.1:{port}\) at score_remote "
             r"\(\S+ray_rl_driver\.py:\d+\)")
    if runner:
        assert re.search(r"the driver \(pid \d+\) waits on ray\.get at main", summary), summary
        assert re.search(rf"TaskRunner\.run \(pid \d+, running for \d+ s\), {waits}",
                         summary), summary
        [call] = evidence["calls"]
        assert call["call"] == "TaskRunner.run" and call["peers"] == [f"127.0.0.1:{port}"]
    else:
        assert re.search(rf"the driver \(pid \d+\) {waits}", summary), summary
        assert evidence["driver"]["peers"] == [f"127.0.0.1:{port}"]
        assert evidence["calls"] == []   # no actor call holds it
    # AND the process in the read is blamed, waiting on a server that does not answer
    reading = evidence["calls"][0]["pid"] if runner else evidence["driver"]["pid"]
    assert [b["pid"] for b in evidence["blamed"]] == [reading], evidence
    assert evidence["cause"]["kind"] == "server_not_answering", evidence["cause"]


@pytest.mark.parametrize("runner,loaded", [(False, False),
                                           pytest.param(True, True, marks=pytest.mark.alone)],
                         ids=["driver", "task-runner-loaded"])
def test_a_loop_spinning_in_its_normaliser_is_named_not_stalled(
        tmp_path: Path, ray_env: dict[str, str], runner: bool, loaded: bool) -> None:
    """About 45 s: the spin must outlast the busy timeout (20 s) after every learner waits; the
    job runs on, as a spin is no stall, until its user, warned, stops it. Under load py-spy's
    reads of the spinning process without pausing it come torn more often (one CI run, before
    a torn read stopped restarting the spin's clock, warned at 42 s); the bound below allows
    for the samples that come late on a loaded node."""
    # GIVEN a degenerate batch: the loop's normaliser (in the driver, idle, or in a TaskRunner
    # actor with both cores taken) never converges (NaN), on the CPU, until its user stops it
    # (a file it looks at; it gives up by itself after 120 s); the busy timeout at its least
    # (twice the stall timeout)
    stop = tmp_path / "stop"
    env = {**ray_env, "HANG": "normaliser", "GIVE_UP": "120", "STOP_FILE": str(stop),
           "TASK_RUNNER": "1" if runner else "0"}
    with cpu_burner(2 if loaded else 0):
        result = run_until_warned(tmp_path, env, "SD121", stop,
                                  "--busy-timeout", str(2 * STALL), "--on-stall", "kill")
    # THEN the job ran on until its user stopped it (the loop works: no stall, nothing ended it)
    assert result.code == 1 and "did not converge" in result.stderr, result.stderr[-3000:]
    report = result.report()
    assert report["stalls"] == [], result.stderr[-3000:]
    # AND the process of the loop is named spinning in its normaliser's frame
    [finding] = result.findings("SD121")
    assert finding["severity"] == "warning", finding
    who = r"actor TaskRunner" if runner else "the driver"
    # (its own frame; once, in CI, the one of the expression it spins in: normalise's genexpr)
    assert re.search(rf"{who} \(pid \d+\) has been busy in one unchanging stack for \d+ s "
                     r"at normalise(\.<locals>\.<genexpr>)? \(\S+ray_rl_driver\.py:\d+\)",
                     finding["summary"]), finding
    assert finding["evidence"]["busy_seconds"] >= 2 * STALL
    # within the busy timeout of every learner waiting (a few seconds after the hang), and two
    # stall timeouts more for the samples that come late on a loaded node
    assert finding["t"] - hang_from(result) <= 4 * STALL, finding


def run_until_warned(tmp_path: Path, env: dict[str, str], code: str, stop: Path,
                     *options: str) -> Result:
    """The watched job, stopped by its user (``stop`` made) once the watch printed the
    finding ``code``."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        watcher = start_watch(tmp_path / "run", [sys.executable,
                                                 str(SCENARIOS / "ray_rl_driver.py")],
                              "--stall-timeout", str(STALL), *options, env=env, stdout=stdout,
                              stderr=stderr)
        try:
            wait_in_file(err, rf"\b{code}\b", watcher, 300)
            stop.touch()
            watcher.wait(timeout=120)
        finally:
            if watcher.poll() is None:
                end_watched(watcher)
    return Result(watcher.returncode, err.read_text(), tmp_path / "run", out.read_text())


@pytest.mark.alone
def test_a_driver_scoring_longer_than_the_stall_timeout_is_working(
        tmp_path: Path, ray_env: dict[str, str]) -> None:
    """About 60 s: a step of 20 s of scoring (twice the stall timeout, the length that would be a
    stall if scoring were not work) after a first step of the usual half second, under load."""
    # GIVEN a reward model that scores for twice the stall timeout in the second step (the
    # first has seen every learner at work) while every learner waits for its next task, the
    # server idle between its calls; under load (where a false stall would come from), with the
    # kill action armed
    env = {**ray_env, "SCORE_SECONDS": str(2 * STALL), "SCORE_FROM": "1", "STEPS": "2"}
    result = run(tmp_path, env, True, "--on-stall", "kill")
    # THEN the loop runs to its end: no stall, no finding about the driver or its actors
    assert result.code == 0, result.stderr[-3000:]
    assert result.stdout.count(" loss ") == 2
    report = result.report()
    assert report["stalls"] == [], result.stderr[-3000:]
    assert [f for f in report["findings"] if f["code"] in ("SD120", "SD121")] == []
    assert "the driver (pid" in result.stderr   # it was watched, as the driver


@RUNNER
def test_an_engine_whose_init_raised_is_named_with_its_class_and_its_error(
        tmp_path: Path, ray_env: dict[str, str], runner: bool) -> None:
    # GIVEN the generation server's __init__ raising, as a vLLM engine actor that cannot start
    # does (the loop in a TaskRunner actor, or in the driver: its first call to the server
    # fails)
    env = {**ray_env, "SERVER_RAISES": "No CUDA GPUs are available",
           "TASK_RUNNER": "1" if runner else "0"}
    result = run(tmp_path, env, False)
    assert result.code == 1, result.stderr[-3000:]
    # THEN Ray's words are read: the actor's class, its pid, and what its __init__ raised
    [finding] = result.findings("SD532")
    evidence = finding["evidence"]
    assert evidence["actor_class"] == "GenerationServer" and evidence["pid"].isdigit(), evidence
    assert evidence["raised"] == "RuntimeError: No CUDA GPUs are available", evidence
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)
    assert re.search(r"Ray actor GenerationServer \(\w+\) died \(pid \d+ on [\d.]+\): its "
                     r"__init__ raised RuntimeError: No CUDA GPUs are available; every call to "
                     r"it fails", finding["summary"]), finding["summary"]
    # AND the error is no stall: the job ended on it
    assert result.report()["stalls"] == [], result.stderr[-3000:]


# ----- what a sampled stack says: spinning in place, or moving ----------------------------------
JOB = "/home/user/rl/driver.py"


def sampled(t: float, *functions: str, pid: int = 7) -> RankStacks:
    """The driver's main thread on the CPU in ``functions`` (innermost first), at ``t``."""
    frames = tuple(Frame(f, JOB, 10 + i) for i, f in enumerate(functions)) + (
        Frame("<module>", JOB, 200),)
    return RankStacks(-pid, pid, t, "py-spy-nonblocking",
                      (ThreadStack(pid, "MainThread", True, True, frames),))


def busy_since(samples: list[RankStacks]) -> float | None:
    job = RayJob(None, StackProbe(None), 10.0)
    job.known[7] = seen = _Process(RayProcess(7, DRIVER))
    for stacks in samples:
        job._seen(seen, stacks)
    return seen.busy_since


def test_a_loop_spinning_in_one_function_stays_busy_through_a_torn_read() -> None:
    # one function, its generator expressions in and out, and one read torn mid-frame
    assert busy_since([sampled(1, "normalise", "main"),
                       sampled(2, "<genexpr>", "normalise", "main"),
                       sampled(3, "score", "main"),            # torn: a frame misread
                       sampled(4, "normalise", "main"),
                       sampled(5, "normalise.<locals>.<listcomp>", "normalise", "main")]) == 1


def test_a_spin_is_placed_where_it_spun_not_at_one_differing_sample() -> None:
    # the spin, then the first sample of the loop stopped by its user (unwinding, in Ray's
    # ActorHandle.__del__): one differing sample is no move, and the finding must not say the
    # actor spins there (seen in CI: SD121 rewritten at ActorHandle.__del__)
    job = RayJob(None, StackProbe(None), 10.0)
    job.known[7] = seen = _Process(RayProcess(7, DRIVER))
    for stacks in (sampled(1, "normalise", "main"), sampled(2, "normalise", "main"),
                   sampled(3, "ActorHandle.__del__", "main")):
        job._seen(seen, stacks)
    outside = job._outside(seen, 4.0)
    assert seen.busy_since == 1 and outside.busy_for == 3.0
    assert outside.frame is not None and outside.frame.function == "normalise", outside
    assert outside.stacks is not None and outside.stacks.t == 2
    # AND once a second sample moved on too, the spin's clock starts again there
    job._seen(seen, sampled(5, "ActorHandle.__del__", "main"))
    assert seen.busy_since == 5 and job._outside(seen, 5.0).frame.function == "ActorHandle.__del__"


def test_a_stack_that_moves_is_no_spin() -> None:
    # a reward model's layers one after the other: the spin clock starts again
    assert busy_since([sampled(1, "forward", "score", "main"),
                       sampled(2, "embed", "score", "main"),
                       sampled(3, "tokenize", "score", "main"),
                       sampled(4, "forward", "score", "main")]) == 3


def test_the_drivers_turn_holds_while_no_rank_is_seen_with_work() -> None:
    # every rank waits for its next task; then, on a loaded node, no rank is read for 30 s (in
    # neither set): the driver's spin clock must not start again; a rank seen in a task ends it
    job = RayJob(None, StackProbe(None), 10.0)
    job.known[7] = seen = _Process(RayProcess(7, DRIVER))
    job.ranked = True   # the job's learners are ranks
    job.observe(100.0, True)
    job._seen(seen, sampled(100.0, "normalise", "main"))
    job.observe(130.0, False, in_task=False)
    assert job.turn_since == 100.0 and seen.busy_since == 100.0
    assert [s.process.pid for s in job.spinning(130.0, 20.0)] == [7]
    job.observe(131.0, False, in_task=True)
    assert job.turn_since is None and job.spinning(131.0, 20.0) == ()


# an actor downloading a checkpoint into memory (a hub client's BytesIO): its main thread waits
# in a socket read, its bytes come in over TCP (no rchar: recv is no read)
DOWNLOADING = r'''
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1]) as source:
    print("ready", flush=True)
    while source.read(64 * 1024):
        pass
'''
IN_SOCKET = (Frame("SocketIO.readinto", "/usr/lib/python3.11/socket.py", 706),
             Frame("download_shard", JOB, 40), Frame("<module>", JOB, 200))


def _waiting_in_socket(pid: int, t: float) -> RankStacks:
    return RankStacks(-pid, pid, t, "py-spy-nonblocking",
                      (ThreadStack(pid, "MainThread", False, False, IN_SOCKET),))


@pytest.mark.parametrize("reads", [True, False], ids=["downloading", "silent"])
def test_an_actor_reading_bytes_in_a_socket_wait_works(reads: bool) -> None:
    # GIVEN the job's turn (every rank between tasks) and an actor whose stack waits in a
    # socket read: a real process that downloads at 512 kB/s all along, or one whose storage
    # stopped sending once the connection was open
    with trickle_storage(64 << 20, 512 << 10, {"shard-0": 0 if not reads else 64 << 20}) \
            as storage:
        quiet, start = _download_ticks(storage.url + "/shard-0")
    # THEN the one reading bytes worked to the last tick (no quiet spell); the silent one has
    # been quiet since the turn began
    assert quiet == (start + 2.0 if reads else start), (quiet, start)


def _download_ticks(url: str) -> tuple[float | None, float]:
    """The Ray part's quiet spell after two seconds of ticks, the actor downloading ``url``;
    and when its turn began."""
    actor = subprocess.Popen([sys.executable, "-c", DOWNLOADING, url], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert actor.stdout is not None and actor.stdout.readline().strip() == "ready"
        job = RayJob(None, StackProbe(None), 10.0)
        job.known[actor.pid] = seen = _Process(RayProcess(actor.pid, ACTOR, "Downloader"))
        start = time.time()
        job.observe(start, True)
        job._seen(seen, _waiting_in_socket(actor.pid, start))
        # WHEN two seconds of ticks go by
        for tick in range(1, 5):
            time.sleep(0.5)
            job.observe(start + tick * 0.5, True)
        job._seen(seen, _waiting_in_socket(actor.pid, start + 2.0))
        return job.quiet_since(start + 2.0), start
    finally:
        actor.kill()
        actor.wait()


# ----- a Ray cluster started apart: `ray start`, then the driver under watch --------------------
@pytest.fixture
def apart_cluster(ray_env: dict[str, str]) -> Iterator[tuple[dict[str, str], int]]:
    """A head node started with `ray start` outside the watched command, as verl's multi-node
    docs have it (its own session: its processes are ended with it); yields the environment a
    driver joins it with (RAY_ADDRESS) and the cluster's session."""
    gcs, dashboard = free_port(), free_port()
    env = {**os.environ, **ray_env}
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--num-cpus", "3",
         "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dashboard), "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = head.communicate(timeout=120)
        assert head.returncode == 0, out[-3000:]
        yield {**ray_env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}, head.pid
    finally:
        end_session(head.pid)


def end_session(session: int) -> None:
    """SIGKILL to every process of the session ``session`` (a cluster's daemons and workers)."""
    for proc in psutil.process_iter():
        try:
            if _in_session(proc.pid, session):
                proc.kill()
        except psutil.Error:
            continue


def _in_session(pid: int, session: int) -> bool:
    try:
        return os.getsid(pid) == session
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_driver_that_joined_a_cluster_started_apart_is_judged_with_its_actors(
        tmp_path: Path, apart_cluster: tuple[dict[str, str], int]) -> None:
    # GIVEN a cluster started apart, and under watch a driver that joins it: its actors are the
    # cluster's workers, outside the watched command's tree and without stalldoc's agent; the
    # server's load_weights never completes, the health check queued behind it; the kill
    # action armed (the healthy loop on such a cluster is the loaded one, below)
    cluster, session = apart_cluster
    env = {**cluster, "HANG": "weight_sync", "PING_TIMEOUT": "300"}
    result = run(tmp_path, env, False, "--on-stall", "kill")
    # THEN the actors are learnt from Ray's state API, said as such, and no rank is guessed
    assert "(it joined a Ray cluster started apart)" in result.stderr, result.stderr[-3000:]
    adopted = re.findall(r"actor (\w+) \(pid \d+\): of this job, in the Ray cluster started "
                         r"apart, known from Ray's state API", result.stderr)
    assert sorted(adopted) == ["GenerationServer", "PolicyLearner", "PolicyLearner"], adopted
    # AND the job's stall is declared within twice the stall timeout of the hang, where it
    # stands: the driver in ray.get, the health check queued behind load_weights, which waits
    # in its rendezvous at its own line
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - hang_from(result) <= 2 * STALL, (stall, result.stderr[-3000:])
    [finding] = result.findings("SD120")
    summary = finding["summary"]
    assert finding["ranks"] == [] and "which of its processes are ranks is not known" in summary
    assert re.search(r"the driver \(pid \d+\) waits on ray\.get at rl_loop \(\S+ray_rl_driver"
                     r"\.py:\d+\)", summary), summary   # the cluster's own sockets no server
    assert "GenerationServer.ping queued behind GenerationServer.load_weights (pid" in summary
    assert re.search(r"waits on collective at GenerationServer\.load_weights \(\S+:\d+\)",
                     summary), summary
    # AND the kill ended the job, never the cluster: its raylet and GCS live on
    assert result.code != 0 and "--on-stall kill: ending the job" in result.stderr
    daemons = {p.name() for p in psutil.process_iter() if _in_session(p.pid, session)}
    assert {"raylet", "gcs_server"} <= daemons, daemons


@pytest.mark.alone
def test_a_healthy_loop_on_a_cluster_started_apart_is_quiet(
        tmp_path: Path, apart_cluster: tuple[dict[str, str], int]) -> None:
    # GIVEN the healthy loop on a cluster started apart, under load, the kill action armed
    result = run(tmp_path, {**apart_cluster[0], "STEPS": "8"}, True, "--on-stall", "kill")
    # THEN it runs to its end with no stall and no finding about the driver or its actors
    assert result.code == 0, result.stderr[-3000:]
    assert result.stdout.count(" loss ") == 8
    report = result.report()
    assert report["stalls"] == [], result.stderr[-3000:]
    assert [f for f in report["findings"] if f["code"] in ("SD120", "SD121")] == []
    assert "of this job, in the Ray cluster started apart" in result.stderr


def test_a_spin_is_placed_in_its_function_not_in_the_expression_it_spins_in() -> None:
    # the deciding thread's id not among the sample's (a read whose ids differ): the thread is
    # found by the frame it decided on, and the place is the function around its genexpr
    stacks = sampled(1, "normalise.<locals>.<genexpr>", "normalise", "main")
    kind = dataclasses.replace(classify(stacks), thread=12345)
    place = _place(kind, stacks)
    assert place is not None and place.function == "normalise", place


# ----- a Ray job with no rank: its driver, actors and task workers are the job -----------------
BURN = "import sys; print('ready', flush=True)\nwhile True: pass"
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


def _started(code: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


# a process Ray started (its raylet, say) that starts one of its own (a worker, a runtime
# environment's pip), which burns a core or sleeps
BELOW = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
         "print('ready', flush=True); import time; time.sleep(60)")


@pytest.mark.parametrize("busy", ["daemon", "below-daemon-since-up", "below-daemon-at-start",
                                  "sandbox"])
def test_a_drivers_own_descendants_work_for_it_and_rays_daemons_do_not(busy: str) -> None:
    # GIVEN a job that is its driver alone (no rank), the driver waiting on its children: one
    # that Ray says it started for its node (its raylet, say), with a child of its own, and
    # one the driver's own (a reward sandbox); one of the three burns a core, the rest sleep.
    # The daemon's child started once the driver's Ray was up (a worker starting, a runtime
    # environment's pip), or with the node (its dashboard agent, which Ray keeps)
    up_ticks = scan().uptime
    below = busy.startswith("below-daemon")
    daemon = subprocess.Popen([sys.executable, "-c", BELOW if below else
                               BURN if busy == "daemon" else SLEEP, BURN if below else SLEEP],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert daemon.stdout is not None and daemon.stdout.readline().strip() == "ready"
    sandbox = _started(BURN if busy == "sandbox" else SLEEP)
    try:
        job = RayJob(None, StackProbe(None), 10.0)
        job.background.request = lambda rank: None   # type: ignore  # py-spy: a child too
        job.up_ticks = up_ticks if busy == "below-daemon-since-up" else scan().uptime + 1
        me = os.getpid()
        job.known[me] = seen = _Process(RayProcess(me, DRIVER, daemons=(daemon.pid,)))
        start = time.time()
        job.observe(start, False)
        job._seen(seen, _waiting_in_socket(me, start))
        # WHEN its CPU and its descendants' are read a second apart
        job._read_cpu(scan(), start)
        time.sleep(1.0)
        job._read_cpu(scan(), start + 1.0)
        job.observe(start + 1.0, False)
        quiet = job.quiet_since(start + 1.0)
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
        sandbox.kill()
        sandbox.wait()
    # THEN it is the job's turn from the start (no rank); the sandbox's CPU is the driver's
    # work, and so is what started below Ray's daemon since the node was up; the daemon's own,
    # and what it started with the node, are Ray's upkeep
    assert job.alone and job.turn_since == start
    works = busy in ("sandbox", "below-daemon-since-up")
    assert quiet == (start + 1.0 if works else start), (quiet, start)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_a_task_worker_is_read_by_its_cpu_before_its_stack(busy: bool) -> None:
    # GIVEN a job with no rank: its driver and a task worker of Ray's pool, idle or running a
    # task that burns a core
    worker = _started(BURN if busy else SLEEP)
    try:
        job = RayJob(None, StackProbe(None), 10.0)
        requested: list[int] = []
        job.background.request = lambda rank: requested.append(rank.pid)   # type: ignore
        job.known[1] = _Process(RayProcess(1, DRIVER))
        job.known[worker.pid] = seen = _Process(RayProcess(worker.pid, WORKER))
        start = time.time()
        job._read_cpu(scan(), start)
        time.sleep(1.0)
        job._read_cpu(scan(), start + 1.0)
        # WHEN the turn's samples are asked for
        job.observe(start + 1.0, False)
    finally:
        worker.kill()
        worker.wait()
    # THEN the busy worker's stack is read (is it work, or a spinning wait?); the idle one's
    # is not: it used no CPU, so it has no work, and it is seen so now
    assert (worker.pid in requested) == busy and 1 in requested
    assert (seen.kind is NO_CPU and seen.at == start + 1.0) != busy


def _quiet_driver(job: RayJob, t: float) -> _Process:
    job.known[7] = seen = _Process(RayProcess(7, DRIVER))
    job.observe(t, False)
    job._seen(seen, _waiting_in_socket(7, t))
    return seen


@pytest.mark.parametrize("scheduling", ["INFEASIBLE", "NO_RESOURCES"])
def test_a_placement_group_is_a_wait_for_the_cluster_only_where_no_node_can_hold_it(
        scheduling: str) -> None:
    # GIVEN Ray's state of a driver's job alone, waiting from t=100: one placement group
    # pending, which no node of the cluster can hold (INFEASIBLE: a node may be on its way,
    # an autoscaler's), or which waits for resources the job itself holds
    job = RayJob(None, StackProbe(None), 10.0)
    seen = _quiet_driver(job, 100.0)
    group = RayPlacementGroup("a1", "rollout", "PENDING", ("{'GPU': 1.0}",) * 2, scheduling)
    job.asked_at = 104.0
    job._take(RayState(placement_groups=(group,)), RayProcess(7, DRIVER), {7})
    # THEN only the first waits for the cluster, for RESOURCE_WAIT; the second is the job's
    # own deadlock, quiet since its wait began
    infeasible = scheduling == "INFEASIBLE"
    assert (job.unplaceable_since == 104.0) == infeasible
    for now, waits in ((110.0, infeasible), (104.0 + RESOURCE_WAIT - 1, infeasible),
                       (104.0 + RESOURCE_WAIT, False)):
        job._seen(seen, _waiting_in_socket(7, now))
        assert job._waits_for_cluster(now) == waits


def test_no_node_type_for_a_request_said_by_rays_autoscaler_ends_the_wait_for_the_cluster(
        ) -> None:
    # GIVEN the same infeasible placement group in Ray's state, and the autoscaler's line in
    # the job's output: no node type of the cluster can hold the request
    job = RayJob(None, StackProbe(None), 10.0)
    _quiet_driver(job, 100.0)
    group = RayPlacementGroup("a1", "rollout", "PENDING", ("{'GPU': 1.0}",) * 2, "INFEASIBLE")
    job.asked_at = 104.0
    job._take(RayState(placement_groups=(group,)), RayProcess(7, DRIVER), {7})
    assert job._waits_for_cluster(105.0)
    job.said_unplaceable(106.0)
    # THEN no node is coming for it: the job waits on nothing that works
    assert not job._waits_for_cluster(107.0)


def test_the_turn_of_a_job_alone_ends_once_a_process_claims_a_rank() -> None:
    # GIVEN a job that is its driver alone; then its actors start with RANK in their
    # environment (verl hands it through runtime_env), before they join their process group
    job = RayJob(None, StackProbe(None), 10.0)
    _quiet_driver(job, 100.0)
    assert job.alone and job.turn_since == 100.0
    job.ranked = True
    job.observe(101.0, False, in_task=False)
    # THEN the job is its ranks' now: this part's turn ends at once (no rank read yet is no
    # reason to judge the job on its driver alone)
    assert job.turn_since is None and job.quiet_since(101.0) is None
