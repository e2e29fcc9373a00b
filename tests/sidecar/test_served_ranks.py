"""The job's serving ranks, found by the URL their agent wrote: waiting for requests is no work
in hand, and once their engine runs, their socket traffic is no work of theirs."""
from __future__ import annotations

import socket
from pathlib import Path

from stalldoc.agent.statefile import REQUESTS_RECORD, requests_path, served_path
from stalldoc.model.ranks import RankProcess
from stalldoc.model.samples import HostSample
from stalldoc.model.served import ServedRank
from stalldoc.sidecar.served import ServedRanks


def _host(rank: int, io: float) -> HostSample:
    return HostSample(10.0, rank, 100 + rank, 1.0, 1 << 20, 4, "sleeping", 1 << 30, 1.0, 0,
                      None, io, None, None)


def test_a_rank_serves_once_its_agent_wrote_where_and_a_new_process_starts_afresh(tmp_path):
    served = ServedRanks(str(tmp_path))
    server, trainer = RankProcess(0, 100, 0, ("python",)), RankProcess(1, 101, 1, ("python",))
    parents = {100: 1, 101: 1}
    assert served.refresh([server, trainer], parents) == []   # not serving yet (loading)
    Path(served_path(str(tmp_path), 100)).write_text("http://127.0.0.1:8000\n")
    assert served.refresh([server, trainer], parents) == [(0, "http://127.0.0.1:8000")]
    assert served.refresh([server, trainer], parents) == []   # said once
    # THEN only the serving rank whose engine waits for requests has no work in hand
    assert served.awaiting({0, 1}) == {0}
    # AND a new process holding rank 0 serves nothing until its own agent says so
    assert served.refresh([RankProcess(0, 200, 0, ("python",))], {200: 1}) == []
    assert served.awaiting({0}) == set()


def test_a_rank_whose_child_serves_serves(tmp_path):
    # GIVEN vllm serve --api-server-count 2: the rank's process supervises two API servers
    # (its children), each writing where it listens; and a served file of a process gone
    for pid, port in ((110, 8000), (111, 8000), (999, 9000)):
        Path(served_path(str(tmp_path), pid)).write_text(f"http://127.0.0.1:{port}\n")
    served = ServedRanks(str(tmp_path))
    # (watched alone, the job's one process: rank 0 as guessed, no claim of its own)
    rank = RankProcess(0, 100, None, ("vllm", "serve"), from_env=False, source="")
    # THEN the rank serves, once, at its first API server's URL
    assert served.refresh([rank], {100: 1, 110: 100, 111: 100}) == [(0, "http://127.0.0.1:8000")]
    assert served.urls == {0: (110, "http://127.0.0.1:8000")} and served.parts == {}


def test_a_server_a_trainer_rank_started_is_the_jobs_not_the_ranks(tmp_path):
    # GIVEN two trainer ranks of a process group; rank 0 started a reward server as its child
    # (pid 110), which wrote where it listens
    Path(served_path(str(tmp_path), 110)).write_text("http://127.0.0.1:8000\n")
    served = ServedRanks(str(tmp_path))
    ranks = [RankProcess(0, 100, 0, ("python", "train.py"), source="process group"),
             RankProcess(1, 101, 1, ("python", "train.py"), source="process group")]
    parents = {100: 1, 101: 1, 110: 100}
    # THEN no rank serves: rank 0 is judged by its own work, as every trainer rank
    assert served.refresh(ranks, parents) == [] and served.urls == {}
    assert served.awaiting({0, 1}) == set()
    # AND the server is a part of the job below rank 0, said once
    assert served.parts == {110: (0, "http://127.0.0.1:8000")}
    assert served.fresh_parts == [(110, 0, "http://127.0.0.1:8000")]
    served.refresh(ranks, parents)
    assert served.fresh_parts == [] and served.parts == {110: (0, "http://127.0.0.1:8000")}
    # AND it holds the requests its agent counted
    Path(requests_path(str(tmp_path), 110)).write_text(REQUESTS_RECORD.format(1, 3))
    [server] = served.job_servers({110: "python reward.py"}).values()
    assert (server.pid, server.owner, server.in_flight) == (110, 0, 1), server
    assert server.describe() == ("pid 110 (python reward.py), a server below rank 0 at "
                                 "http://127.0.0.1:8000, holding 1 request it has not answered")


def test_a_serving_ranks_io_is_set_apart_only_once_its_engine_ran(tmp_path):
    Path(served_path(str(tmp_path), 100)).write_text("http://127.0.0.1:8000\n")
    served = ServedRanks(str(tmp_path))
    served.refresh([RankProcess(0, 100, 0, ("python",)), RankProcess(1, 101, 1, ("python",))],
                   {100: 1, 101: 1})
    host = {0: _host(0, 90_000.0), 1: _host(1, 90_000.0)}
    # a metrics scrape of 90 kB/s: the server's engine has not run yet, so it still counts
    assert served.without_traffic(host, set())[0].io_bps == 90_000.0
    after = served.without_traffic(host, {0, 1})
    assert after[0].io_bps is None and after[1].io_bps == 90_000.0   # rank 1 serves nothing


def test_metrics_are_read_only_for_the_ranks_a_diagnosis_asks_about(tmp_path):
    with socket.socket() as sock:   # a port just freed: nobody answers there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    Path(served_path(str(tmp_path), 100)).write_text(url + "\n")
    served = ServedRanks(str(tmp_path))
    served.refresh([RankProcess(0, 100, 0, ("python",))], {100: 1})
    # a tick's view reads nothing; a diagnosis of rank 0 reads its server, and says why not
    assert served.view({0})[0] == ServedRank(0, 100, url, True, None, "")
    [(rank, view)] = served.view(set(), [0]).items()
    assert view.metrics is None and view.metrics_error.startswith(f"{url}/metrics did not answer")


def test_a_server_without_an_engine_is_judged_by_the_requests_it_holds(tmp_path):
    # GIVEN rank 0 serving a reward model (no vLLM engine), rank 1 a vLLM server whose engine
    # is busy, both holding no request by their agents' counts
    for pid in (100, 101):
        Path(served_path(str(tmp_path), pid)).write_text(f"http://127.0.0.1:{8000 + pid}\n")
        Path(requests_path(str(tmp_path), pid)).write_text(REQUESTS_RECORD.format(0, 7))
    served = ServedRanks(str(tmp_path))
    served.refresh([RankProcess(0, 100, 0, ("python",)), RankProcess(1, 101, 1, ("python",))],
                   {100: 1, 101: 1})
    # THEN the server without an engine has no work in hand; the vLLM one is judged by its
    # engine (not idle: work in hand)
    assert served.awaiting(set(), with_engines={1}) == {0}
    # AND holding a request, it has work in hand, and the view says how many it holds
    Path(requests_path(str(tmp_path), 100)).write_text(REQUESTS_RECORD.format(1, 8))
    assert served.awaiting(set(), with_engines={1}) == set()
    assert served.view(set())[0].in_flight == 1
    # AND a server whose counts its agent could not read (another uvicorn) is not guessed idle
    Path(requests_path(str(tmp_path), 100)).unlink()
    assert served.awaiting(set(), with_engines={1}) == set()
    assert served.view(set())[0].in_flight is None


def test_a_server_below_no_rank_is_the_jobs(tmp_path):
    # GIVEN a launch script (pid 50) that started a reward server (pid 60) beside torchrun's
    # ranks (pids 100, 101 below its launcher, pid 70)
    Path(served_path(str(tmp_path), 60)).write_text("http://127.0.0.1:8000\n")
    served = ServedRanks(str(tmp_path))
    ranks = [RankProcess(r, 100 + r, r, ("python", "train.py")) for r in (0, 1)]
    parents = {50: 1, 60: 50, 70: 50, 100: 70, 101: 70}
    # THEN no rank serves, and the server is the job's, below no rank
    assert served.refresh(ranks, parents) == [] and served.urls == {}
    assert served.parts == {60: (None, "http://127.0.0.1:8000")}
    [server] = served.job_servers({}).values()
    assert server.describe() == "pid 60, a server of the job at http://127.0.0.1:8000"
