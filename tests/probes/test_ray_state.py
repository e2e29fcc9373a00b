"""Which process of a Ray job is its driver and which an actor, as their agents publish it
(``agent/ray_facts.py``), and the state API read at a stall (``probes/ray_state.py``); the
answers of a real cluster are read in ``tests/sidecar/test_ray_job.py``."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from stalldoc.agent.ray_facts import publish
from stalldoc.model.ray_job import ACTOR, DRIVER, WORKER
from stalldoc.probes.ray_state import drivers, job_state, ray_processes, read_state


def test_the_driver_the_actors_and_the_task_workers_are_what_their_agents_say(
        tmp_path: Path) -> None:
    publish(str(tmp_path), 10, {"mode": "driver", "job_id": "01000000", "actor_id": "",
                                "actor_class": "", "dashboard": "127.0.0.1:8265",
                                "daemons": "31,32,x,-4,33"})
    publish(str(tmp_path), 11, {"mode": "worker", "job_id": "01000000", "actor_id": "ab12",
                                "actor_class": "RewardWorker", "dashboard": ""})
    publish(str(tmp_path), 12, {"mode": "worker", "job_id": "01000000", "actor_id": "",
                                "actor_class": "", "dashboard": ""})   # a plain task's worker
    (tmp_path / "ray-13.json").write_text("{not json")
    publish(str(tmp_path), 15, {"mode": "3", "job_id": "", "actor_id": ""})   # a spill worker
    found = ray_processes(str(tmp_path), [10, 11, 12, 13, 14, 15])
    assert sorted(found) == [10, 11, 12]
    assert found[10].role == DRIVER and found[10].dashboard == "127.0.0.1:8265"
    assert found[10].daemons == (31, 32, 33)     # what Ray started for its node, as it says
    assert found[11].role == ACTOR and found[11].actor_class == "RewardWorker"
    assert found[11].label == "actor RewardWorker (pid 11)"
    assert found[12].role == WORKER and found[12].label == "task worker (pid 12)"
    assert found[11].daemons == found[12].daemons == ()
    assert ray_processes(str(tmp_path), [11, 13]).keys() == {11}   # only the pids asked


@pytest.fixture
def dashboard() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that answers every path as a cluster without the state module
    does (its HTTP head off: here, a 404), and records the paths asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}", asked
    server.shutdown()


def test_a_dashboard_without_the_state_api_is_said_so(dashboard: tuple[str, list[str]]) -> None:
    address, asked = dashboard
    state = read_state(address)
    assert state.actors == () and state.tasks == ()
    assert state.error.startswith(f"Ray's state API at http://{address} did not answer"), state
    assert asked == ["/api/v0/actors?detail=1&limit=1000"]


def test_no_dashboard_at_all_is_said_so() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]   # nobody listens there once closed
    assert "did not answer" in read_state(f"127.0.0.1:{port}", timeout=2).error
    assert read_state("").error == "no Ray dashboard address (is ray[default] installed?)"
    assert read_state("http://user:secret@host:1").error.startswith("no Ray dashboard")


def test_what_the_state_api_answers_is_read() -> None:
    # the shape of Ray 2.60's /api/v0 answers (as tests/sidecar/test_ray_job.py reads them live)
    body = {"result": True, "msg": "", "data": {"result": {"total": 3, "result": [
        {"func_or_class_name": "Server.ping", "state": "SUBMITTED_TO_WORKER",
         "actor_id": "a1", "worker_pid": None, "start_time_ms": None},
        {"func_or_class_name": "Server.load_weights", "state": "RUNNING", "actor_id": "a1",
         "worker_pid": 4242, "start_time_ms": 1795916608361.0},
        {"func_or_class_name": "Learner.train", "state": "FINISHED", "actor_id": "b2",
         "worker_pid": 4343, "start_time_ms": 1795916607834.0}]}}}
    served = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(served)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = read_state(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert state.error == ""
    running = [t for t in state.tasks if t.running]
    assert [(t.name, t.pid, t.started_at) for t in running] == [
        ("Server.load_weights", 4242, 1795916608.361)]
    assert [t.name for t in state.queued_behind(running[0])] == ["Server.ping"]
    assert "Learner.train" not in [t.name for t in state.tasks]   # finished: not the job's now


def test_one_jobs_state_is_asked_for_that_job_only(dashboard: tuple[str, list[str]]) -> None:
    # a driver that joined a cluster started apart: the state API is asked for its job alone
    address, asked = dashboard
    with pytest.raises(OSError):
        job_state(address, "02000000")   # the 404 of a dashboard without the state module
    assert asked == ["/api/v0/actors?detail=1&limit=1000&filter_keys=job_id&filter_predicates="
                     "%3D&filter_values=02000000"]
    with pytest.raises(ValueError):
        job_state(address, "02000000&filter_keys=x")   # never a query made of what it read
    assert len(asked) == 1


def test_a_driver_that_joined_a_cluster_started_apart_says_so(tmp_path: Path) -> None:
    publish(str(tmp_path), 20, {"mode": "driver", "job_id": "02000000", "actor_id": "",
                                "actor_class": "", "dashboard": "127.0.0.1:8265",
                                "node_id": "5130ce", "cluster": "joined"})
    publish(str(tmp_path), 21, {"mode": "driver", "job_id": "01000000", "actor_id": "",
                                "actor_class": "", "dashboard": "127.0.0.1:8266",
                                "node_id": "77aa01", "cluster": "started"})
    publish(str(tmp_path), 22, {"mode": "worker", "job_id": "01000000", "actor_id": "cd34",
                                "actor_class": "Learner", "dashboard": "", "node_id": "77aa01",
                                "cluster": ""})
    found = ray_processes(str(tmp_path), [20, 21, 22])
    assert (found[20].joined, found[20].node_id) == (True, "5130ce")
    assert not found[21].joined and not found[22].joined
    assert drivers(str(tmp_path), [20, 21, 22, 23]) == {20, 21}
    assert drivers(str(tmp_path), [22]) == set()
