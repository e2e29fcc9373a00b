"""The TCP bytes probe: a process's downloads and uploads over sockets, which the kernel's rchar
and wchar never count (recv and send are no read or write), from sock_diag by socket inode."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from stalldoc.detect.work import IO_WORK_BPS
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.host import HostProbe
from stalldoc.probes.proc_table import read_io, scan
from stalldoc.probes import tcp_bytes
from stalldoc.probes.tcp_bytes import TcpBytes, socket_inodes
from support import trickle_storage

# a rank fetching its shard into memory, as a hub client or an object store's SDK does, one
# connection per shard
DOWNLOADER = r'''
import sys, urllib.request
print("ready", flush=True)
for name in sys.argv[2:]:
    body = urllib.request.urlopen(f"{sys.argv[1]}/{name}").read()
    print(name, len(body), flush=True)
input()
'''
RATE = 512 << 10


def start(url: str, *shards: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DOWNLOADER, url, *shards],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_download_into_memory_moves_tcp_bytes_that_rchar_does_not_count():
    # GIVEN a process downloading 2 MB at 512 kB/s into memory, a second shard on a new
    # connection once the first has closed, read every half second as the watcher's ticks do
    with trickle_storage(1 << 20, RATE) as storage:
        proc = start(storage.url, "shard-0", "shard-1")
        try:
            start_ticks = scan().procs[proc.pid].start_ticks
            tcp = TcpBytes()
            tcp.refresh()
            counts, files = [tcp.of(proc.pid, start_ticks)], read_io(proc.pid)
            for _ in range(10):
                time.sleep(0.5)
                tcp.refresh()
                counts.append(tcp.of(proc.pid, start_ticks))
            files_after = read_io(proc.pid)
            assert proc.stdout is not None
            said = [proc.stdout.readline().split() for _ in range(2)]
            # THEN both shards came whole; the count grew with them and never fell (the first
            # connection's bytes stand once it closed), up to all but what each connection
            # moved after its last reading (half a second's at most); rchar + wchar moved by far
            # less than one shard
            assert said == [["shard-0", str(1 << 20)], ["shard-1", str(1 << 20)]]
            assert counts[0] == 0 and counts == sorted(counts), counts
            assert counts[-1] >= (2 << 20) - 2 * RATE // 2, counts
            assert files is not None and files_after is not None
            assert files_after - files < 256 << 10, (files, files_after)
            # AND a pid read again as another process (a reused pid) starts anew
            assert tcp.of(proc.pid, start_ticks + 1) == 0
        finally:
            proc.kill()
            proc.wait()


def test_a_rank_downloading_into_memory_works_by_its_bytes():
    # GIVEN a rank downloading at 512 kB/s, its CPU a few per cent, and a rank idle
    with trickle_storage(8 << 20, RATE) as storage:
        busy = start(storage.url, "shard-0")
        idle = start(storage.url)
        try:
            ranks = [RankProcess(0, busy.pid, 0, ()), RankProcess(1, idle.pid, 1, ())]
            probe = HostProbe()
            probe.sample(time.time(), ranks)
            time.sleep(2.0)
            zero, one = probe.sample(time.time(), ranks)
            # THEN the downloading rank moves bytes at a rate of work, the idle one none
            assert zero.io_bps is not None and zero.io_bps >= IO_WORK_BPS, zero
            assert one.io_bps is not None and one.io_bps < IO_WORK_BPS / 4, one
            assert socket_inodes(busy.pid) and not socket_inodes(idle.pid)
        finally:
            for proc in (busy, idle):
                proc.kill()
                proc.wait()


def test_a_socket_on_a_descriptor_that_held_a_file_counts_in_full_once_its_link_is_read(
        tmp_path):
    # GIVEN this process read with a file open, then a connection put on that file's number
    # (a closed file's number taken by a new socket), 1 MB sent and received over it
    with open(tmp_path / "shard", "wb") as shard:
        tcp = TcpBytes()
        tcp.refresh()
        pid = os.getpid()
        assert tcp.of(pid) == 0
        with socket.create_server(("127.0.0.1", 0)) as server, \
                socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            os.dup2(client.fileno(), shard.fileno())
            os.close(client.detach())    # the connection now on the file's number alone
            sent = 0
            while sent < 1 << 20:
                sent += os.write(shard.fileno(), b"\0" * ((1 << 20) - sent))
            got = 0
            while got < 1 << 20:
                got += len(accepted.recv(1 << 16))
            # WHEN it is read again, tick after tick
            counts = []
            for _ in range(3):
                tcp.refresh()
                counts.append(tcp.of(pid))
                tcp.forget({pid})
            accepted.close()
    # THEN the accepted side counts at once (a new number); the socket on the file's old
    # number, a stray the first listing missed, is found at the next tick with every link
    # read, and its bytes count in full, none lost
    assert (1 << 20) <= counts[0] < 2 << 20 and counts[-1] >= 2 << 20, counts


def test_a_machine_with_no_connection_yet_counts_the_first_ones_in_full(monkeypatch):
    # GIVEN a first reading on a machine with no TCP connection open (what CI's worker met
    # once: the dump then is empty, which is no refusal), then a connection moving 1 MB each
    # way; the empty machine stood in for by the dump's answer, the only part faked
    real = tcp_bytes.tcp_traffic
    monkeypatch.setattr(tcp_bytes, "tcp_traffic", lambda: {})
    tcp = TcpBytes()
    tcp.refresh()
    pid = os.getpid()
    assert tcp.of(pid) == 0
    monkeypatch.setattr(tcp_bytes, "tcp_traffic", real)
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            client.sendall(b"\0" * (1 << 20))
            got = 0
            while got < 1 << 20:
                got += len(accepted.recv(1 << 16))
            tcp.refresh()
            moved = tcp.of(pid)
    # THEN the new connection's bytes count in full (both of its ends are this process's)
    assert moved >= 2 << 20, moved
    # AND a refused dump is told from an empty one: the count stands
    monkeypatch.setattr(tcp_bytes, "tcp_traffic", lambda: None)
    tcp.refresh()
    assert tcp.of(pid) == moved
