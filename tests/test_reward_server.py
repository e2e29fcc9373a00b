"""A reward model's HTTP server watched alone (``tests/scenarios/reward_server.py``: uvicorn on
its main thread, no vLLM engine), as a job that starts its verifier or reward model as a
process of its own runs it. A server is judged by the requests it holds, as uvicorn counts them
(its agent reads them each heartbeat): nobody asking is no stall, however long, and the kill
action armed leaves it alone (it was a STALL at the stall timeout, and --on-stall kill ended a
healthy server). A server holding a request it never answers (a batcher waiting for a batch
that never fills) is a stall, named with the requests it holds."""
from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from load import cpu_burner
from support import SCENARIOS, Result, alarms, end_watched, start_watch, wait_in_file
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
