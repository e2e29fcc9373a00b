"""The connections probe over real sockets of real processes: one read of the socket table gives
each rank's peers outside the job, the same as psutil's per-process reading."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil

from stalldoc.model.ranks import RankProcess
from stalldoc.probes.connections import (ESTABLISHED, LISTEN, TcpSocket, connected_servers,
                                         external_peers, socket_table, sockets_by_pid)

RANK = r'''
import socket, sys, time
outside, family = int(sys.argv[1]), sys.argv[2]
inner = socket.socket(); inner.bind(("127.0.0.1", 0)); inner.listen()   # the job's own (gloo)
a = socket.create_connection(("127.0.0.1", inner.getsockname()[1]))
b, _ = inner.accept()
host = "::1" if family == "6" else "127.0.0.1"
c = socket.create_connection((host, outside))                           # a reward server
print("ready", flush=True)
time.sleep(60)
'''


def _server(family: socket.AddressFamily, host: str) -> socket.socket:
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen()
    return server


def _rank(port: int, family: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(port), family],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _psutil_view(pid: int) -> set[TcpSocket]:
    states = {psutil.CONN_ESTABLISHED: ESTABLISHED, psutil.CONN_LISTEN: LISTEN}
    return {TcpSocket((c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port) if c.raddr else None,
                      states.get(c.status, c.status))
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status in states}


def test_peers_outside_the_job_from_one_table_read():
    # GIVEN two ranks with the job's own connections and one each to servers outside the job
    v4, v6 = _server(socket.AF_INET, "127.0.0.1"), _server(socket.AF_INET6, "::1")
    ranks = [_rank(v4.getsockname()[1], "4"), _rank(v6.getsockname()[1], "6")]
    try:
        processes = [RankProcess(n, p.pid, 0, ()) for n, p in enumerate(ranks)]
        # WHEN the peers are read
        peers = external_peers(processes, [p.pid for p in ranks])
        # THEN each rank's outside server is its only peer; the job's own sockets are left out
        assert peers == {0: (f"127.0.0.1:{v4.getsockname()[1]}",),
                         1: (f"::1:{v6.getsockname()[1]}",)}
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
        v4.close()
        v6.close()


OTHER_SERVER = r'''
import socket, time
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
print(server.getsockname()[1], flush=True)
time.sleep(60)
'''


def test_a_rank_is_matched_to_the_jobs_server_it_is_connected_to():
    # GIVEN the job's own server (this process: it listens) and two ranks: rank 0 connected to
    # it, rank 1 to a server in another process, none of the job's servers
    server = _server(socket.AF_INET, "127.0.0.1")
    other = subprocess.Popen([sys.executable, "-c", OTHER_SERVER], stdout=subprocess.PIPE,
                             text=True)
    assert other.stdout is not None
    ranks = [_rank(server.getsockname()[1], "4"), _rank(int(other.stdout.readline()), "4")]
    try:
        processes = [RankProcess(n, p.pid, 0, ()) for n, p in enumerate(ranks)]
        # WHEN the ranks are matched to the job's servers (this process alone)
        found = connected_servers(processes, [os.getpid()])
        # THEN rank 0 waits on it, by its listening port; rank 1 on none of them
        assert found == {0: (os.getpid(),)}, found
    finally:
        for proc in [*ranks, other]:
            proc.kill()
            proc.wait()
        server.close()


def test_the_table_read_once_matches_psutil():
    server = _server(socket.AF_INET, "127.0.0.1")
    rank = _rank(server.getsockname()[1], "4")
    try:
        time.sleep(0.1)
        assert socket_table() is not None
        ours = {s for s in sockets_by_pid([rank.pid])[rank.pid] if s.state in (ESTABLISHED, LISTEN)}
        assert ours == _psutil_view(rank.pid) and len(ours) == 4
    finally:
        rank.kill()
        rank.wait()
        server.close()
