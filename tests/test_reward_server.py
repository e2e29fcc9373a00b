"""A reward model's HTTP server watched alone (``tests/scenarios/reward_server.py``: uvicorn on
its main thread, no vLLM engine), as a job that starts its verifier or reward model as a
process of its own runs it. A server is judged by the requests it holds, as uvicorn counts them
(its agent reads them each heartbeat): nobody asking is no stall, however long, and the kill
action armed leaves it alone (it was a STALL at the stall timeout, and --on-stall kill ended a
healthy server). A server holding a request it never answers (a batcher waiting for a batch
that never fills) is a stall, named with the requests it holds.

A reward server a trainer rank started as its child (``tests/scenarios/trainer_reward_child.py``)
is the job's, not the rank's: the rank is a trainer, judged by its own work, and a rank waiting
on that server names it by its pid, with the requests it holds."""
from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from load import cpu_burner
from support import (SCENARIOS, Result, alarms, end_watched, free_port, start_watch,
                     torchrun, wait_in_file, watch)
from test_launcher_ranks import job_pid

pytestmark = pytest.mark.timeout(180)
SERVER = str(SCENARIOS / "reward_server.py")


def _served(tmp_path: Path, batch: int, *options: str) -> tuple:
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        watcher = start_watch(tmp_path / "run", [sys.executable, SERVER, str(batch)], *options,
                              stderr=err)
    url = wait_in_file(err_path, r"rank 0 serves (http://\S+):", watcher, timeout=60).group(1)
    return watcher, err_path, url


def _score(url: str, texts: list[str], timeout: float = 30) -> list[float]:
    request = urllib.request.Request(f"{url}/score", json.dumps({"texts": texts}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)["scores"]


@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])   # healthy: under load
def test_a_reward_server_nobody_asks_then_scoring_is_no_stall(tmp_path: Path,
                                                              loaded: bool) -> None:
    # GIVEN a reward server watched alone with the kill action armed (stall timeout 3 s)
    with cpu_burner(2 if loaded else 0):
        watcher, err_path, url = _served(tmp_path, 1, "--on-stall", "kill")
        try:
            # WHEN nobody asks for three stall timeouts, then a trainer's rollouts are scored,
            # then nobody asks again
            time.sleep(10)
            scores = [_score(url, [f"{i} + {i} = {2 * i}", "no idea"]) for i in range(5)]
            time.sleep(10)
            alive = watcher.poll() is None
        finally:
            stdout, _ = end_watched(watcher)
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run", stdout)
    # THEN it scored them all and lived on: no stall, no alarm
    assert alive and len(scores) == 5 and all(len(s) == 2 for s in scores), result.stderr
    assert "STALL" not in result.stderr, result.stderr[-3000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-3000:]
    [rank] = report["ranks"]
    assert rank["pid"] == job_pid(result)


def test_a_reward_server_holding_a_request_it_never_answers_is_named(tmp_path: Path) -> None:
    # GIVEN a reward server that scores once 2 requests are in, watched with the kill armed
    watcher, err_path, url = _served(tmp_path, 2, "--on-stall", "kill")
    try:
        time.sleep(5)   # idle past the stall timeout first: its clock starts at the request
        # WHEN a trainer sends one request (its batch never fills)
        asked = threading.Thread(target=_quietly, args=(url,), daemon=True)
        asked.start()
        stdout, _ = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            end_watched(watcher)
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run", stdout)
    # THEN a stall of the server, ended by the kill action, named with the request it holds
    assert result.code == 124, result.stderr[-3000:]
    [finding] = result.findings("SD117")
    assert finding["ranks"] == [0] and finding["evidence"]["in_flight"] == 1, finding
    assert finding["summary"].startswith(
        f"rank 0 serves {url} and answers none of the 1 request it holds, for "), finding
    assert finding["evidence"]["waits_on_engine"] == [], finding
    assert result.findings("SD107") == []
    # AND the stall came a stall timeout after the request, not before it
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - stall["started_at"] >= 3, stall


def _quietly(url: str) -> None:
    try:
        _score(url, ["1 + 1 = 2"], timeout=80)
    except OSError:
        pass   # the server was ended under it


CHILD = "trainer_reward_child.py"


def _child_server(result: Result) -> tuple[int, str]:
    """The reward server's pid and URL, as the trainer printed them."""
    found = re.search(r"reward server pid (\d+) at (http://\S+)", result.stdout)
    assert found, result.stdout[-2000:] + result.stderr[-3000:]
    return int(found.group(1)), found.group(2)


def test_a_rank_waiting_on_the_reward_server_it_started_names_that_server(tmp_path: Path) -> None:
    # GIVEN two trainer ranks (torchrun); rank 0 started a reward server that scores batches
    # of 2 as its child; WHEN the epoch's last batch sends it one request (never scored)
    result = watch(tmp_path, [*torchrun(2, CHILD), "partial-batch", "3"], "--on-stall", "kill")
    pid, url = _child_server(result)
    # THEN a stall, ended by the kill action: rank 0 is no server, its child is the job's
    assert result.code == 124, result.stderr[-3000:]
    assert f"pid {pid} below rank 0 serves {url}: a server of the job's" in result.stderr
    assert "] rank 0 serves" not in result.stderr and result.findings("SD117") == []
    # AND rank 0's wait names the server by its pid, with the request it holds
    [waits] = [f for f in result.findings("SD107") if f["ranks"] == [0]]
    assert f"from pid {pid} (python trainer_reward_child.py --serve), a server below rank 0 at " \
           f"{url}, holding 1 request it has not answered, its thread " in waits["summary"], \
        waits["summary"]
    [server] = waits["evidence"]["job_servers"]
    assert (server["pid"], server["rank"], server["in_flight"]) == (pid, 0, 1), server
    assert waits["evidence"]["blamed"] == [{"pid": pid, "what": f"a server below rank 0 at {url}"}]
    # AND where the server holds it: the thread of uvicorn's pool that handles the request,
    # in the batcher's wait (FastAPI runs a plain def endpoint in a thread)
    assert "wait_for_batch (" in server["frame"] and server["waits_on"] == "lock", server
    assert f'its thread "{server["thread"]}" in {server["frame"]} waiting on a lock; ' in \
        waits["summary"], waits["summary"]
    assert waits["evidence"]["frame"].startswith("score "), waits["evidence"]["frame"]
    assert f"py-spy dump --pid {pid}" in waits["fix"], waits["fix"]


def test_a_lone_trainer_whose_child_serves_is_judged_by_its_own_work(tmp_path: Path) -> None:
    # GIVEN one trainer process (a world of one) with its reward server as its child; WHEN it
    # waits in its weight-sync store for a key the server never sets (the server idles)
    result = watch(tmp_path, [sys.executable, str(SCENARIOS / CHILD), "store-wait", "2"],
                   "--on-stall", "kill")
    pid, _ = _child_server(result)
    # THEN it is stalled (a trainer whose child serves nobody is no idle server), where it waits
    assert result.code == 124, result.stderr[-3000:]
    [stall] = result.report()["stalls"]
    assert stall["ranks"] == [0], stall
    assert re.search(r"store_wait \(\S+/trainer_reward_child\.py:\d+\)", result.stderr), \
        result.stderr[-3000:]
    assert result.findings("SD117") == [] and f"pid {pid} below rank 0 serves" in result.stderr


def test_a_rank_waiting_on_a_server_its_launch_script_started_names_that_server(
        tmp_path: Path) -> None:
    # GIVEN a launch script that starts the reward server in the background, then torchrun's
    # two trainer ranks (the server is below no rank); WHEN the epoch's last batch sends it one
    # request, which it holds for a batch of 2
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = (f"{sys.executable} {SCENARIOS / CHILD} --serve {port} & "
              f"echo reward server pid $! at {url}; "
              f"exec {' '.join(torchrun(2, CHILD))} partial-batch 3 {url}")
    result = watch(tmp_path, ["bash", "-c", script], "--on-stall", "kill")
    pid, _ = _child_server(result)
    # THEN a stall: rank 0's wait names the job's server by its pid, and where it holds it
    assert result.code == 124, result.stderr[-3000:]
    assert f"pid {pid} serves {url}: a server of the job's, below no rank" in result.stderr
    [waits] = [f for f in result.findings("SD107") if f["ranks"] == [0]]
    assert f"from pid {pid} (python trainer_reward_child.py --serve {port}), a server of the " \
           f"job at {url}, holding 1 request it has not answered, its thread " in \
        waits["summary"], waits["summary"]
    assert waits["evidence"]["blamed"] == [{"pid": pid, "what": f"a server of the job at {url}"}]
    assert result.findings("SD117") == []
