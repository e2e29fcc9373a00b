"""Watches beside each other: one writes its card (``sidecar/peer_card.py``), another finds it
among the run directories beside its own and matches the server its rank waits on
(``cluster/peer_card.py``). Real sockets, real files; the card of a hostile or broken writer is
skipped whole."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from stalldoc.cluster.peer_card import CARD_FILE, matching, read_cards
from stalldoc.detect.raised_lines import RaisedLines
from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.probes.connections import listening_sockets, socket_inodes
from stalldoc.sidecar import peer_card
from stalldoc.sidecar.peer_card import PeerCard, program_of


def finding(code: str, severity: Severity, summary: str) -> Finding:
    return Finding(code, "a-rule", severity, (0,), summary, {}, "fix it")


def test_a_servers_card_is_found_by_the_port_its_job_listens_on(tmp_path: Path) -> None:
    # GIVEN a server's watch whose job (this process) listens on a port, printed an exception
    # and has an open error finding, writing its card into its run directory
    server_dir, trainer_dir = tmp_path / "rollout", tmp_path / "grpo"
    server_dir.mkdir()
    trainer_dir.mkdir()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        raised = RaisedLines("RuntimeError: NCCL is not available", 95.0)
        ledger = Ledger()
        ledger.tick(99.0, [finding("SD507", Severity.ERROR, "the server is unreachable"),
                           finding("SD302", Severity.WARNING, "too many threads")])
        card = PeerCard(server_dir, ["swift", "rollout", "--model", "m"])
        card.write(100.0, [os.getpid()], ledger.open_entries(), raised, stalled=False)
    # WHEN the trainer's watch reads the cards beside its run directory
    cards = read_cards(trainer_dir)
    # THEN it finds the server's by the endpoint its rank waits on, with what that side saw
    [peer] = cards
    assert peer.program == "swift" and peer.state == "running" and port in peer.listening
    assert peer.raised == "RuntimeError: NCCL is not available" and peer.raised_ago == 5.0
    assert [(f.code, f.severity) for f in peer.findings] == [("SD507", "error")]
    host = socket.gethostname()
    assert matching(cards, [f"127.0.0.1:{port}"], host) == peer
    assert matching(cards, [f"localhost:{port}"], host) == peer
    assert matching(cards, [f"127.0.0.1:{port + 1 if port < 65535 else 1}"], host) is None
    assert matching(cards, [f"127.0.0.1:{port}"], "another-host") is None   # not its loopback
    # AND its own card is never its peer
    assert read_cards(server_dir) == ()


def test_cards_that_are_not_cards_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "own").mkdir()
    bad = {"huge": "x" * (70 << 10), "wrong-port": {"format": 1, "host": "h", "state": "running",
                                                       "listening": [70000]},
           "wrong-state": {"format": 1, "host": "h", "state": "sleeping", "listening": []},
           "other-format": {"format": 2, "host": "h", "state": "running"}}
    for name, body in bad.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / CARD_FILE).write_text(json.dumps(body))
    (tmp_path / "truncated").mkdir()
    (tmp_path / "truncated" / CARD_FILE).write_text('{"format": 1, "host": ')
    assert read_cards(tmp_path / "own") == ()


def test_a_secret_in_a_card_is_not_repeated(tmp_path: Path) -> None:
    (tmp_path / "own").mkdir()
    (tmp_path / "peer").mkdir()
    token = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
    (tmp_path / "peer" / CARD_FILE).write_text(json.dumps({
        "format": 1, "host": "h", "state": "ended", "listening": [8000], "exit_code": 1,
        "raised": f"OSError: 401 for https://huggingface.co/api?token={token}"}))
    [peer] = read_cards(tmp_path / "own")
    assert token not in peer.raised and peer.exit_code == 1 and peer.state == "ended"


def test_the_program_is_the_command_or_the_python_script() -> None:
    assert program_of(["swift", "rollout"]) == "swift"
    assert program_of(["/usr/bin/python3", "-u", "serve.py", "--port", "8000"]) == "serve.py"
    assert program_of(["python", "-m", "vllm.entrypoints.openai.api_server"]) == \
        "vllm.entrypoints.openai.api_server"
    assert program_of([]) == ""


def test_a_node_of_a_multi_node_job_finds_the_card_of_a_node_of_another(tmp_path: Path) -> None:
    # the trainer's node directory runs/grpo/node-0, the server's runs/rollout/node-0: the
    # server's card sits two levels below the parent of the trainer's shared directory
    own = tmp_path / "grpo" / "node-0"
    server = tmp_path / "rollout" / "node-0"
    own.mkdir(parents=True)
    server.mkdir(parents=True)
    (server / CARD_FILE).write_text(json.dumps({"format": 1, "host": "h", "state": "running",
                                                "listening": [8000]}))
    assert read_cards(own) == ()   # not a node: only the run directories beside it
    [peer] = read_cards(own, tmp_path / "grpo")
    assert peer.run_dir == str(server) and peer.listening == (8000,)


SERVER = """
import socket, sys
held = []
for line in sys.stdin:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    held.append(sock)
    print(sock.getsockname()[1], flush=True)
"""


def test_the_ports_are_read_again_only_when_the_job_or_the_hosts_listeners_change(
        tmp_path: Path, monkeypatch) -> None:
    # GIVEN a server's watch whose job (a real process) listens on nothing yet; the reads of
    # processes' descriptors counted (the costly part of a card)
    card = PeerCard(tmp_path, ["vllm", "serve", "m"])
    reads: list[int] = []

    def counted(pid: int) -> set[int]:
        reads.append(pid)
        return socket_inodes(pid)

    monkeypatch.setattr(peer_card, "socket_inodes", counted)

    def listening(now: float, pids: list[int]) -> list[int]:
        card.write(now, pids, [], RaisedLines(), stalled=False)
        return json.loads((tmp_path / CARD_FILE).read_text())["listening"]

    def bind() -> int:
        server.stdin.write("listen\n")
        server.stdin.flush()
        return int(server.stdout.readline())

    with subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as server:
        try:
            assert listening(0.0, [server.pid]) == []
            # THEN each port it binds is on the next card
            port = bind()
            assert listening(5.0, [server.pid]) == [port]
            other = bind()
            assert listening(10.0, [server.pid]) == sorted([port, other])
            # AND while nothing listens anew and its processes are the same, its descriptors
            # are not read again (a loop-back connection is no listener)
            # (other tests beside this one open listeners of their own: tried until the host's
            # listeners stood still from before the card before to after this one, as the card
            # compares with what the card before saw)
            with socket.create_connection(("127.0.0.1", port)):
                seen = [listening_sockets()]
                listening(15.0, [server.pid])
                seen.append(listening_sockets())
                for attempt in range(20):
                    before = len(reads)
                    assert listening(16.0 + attempt, [server.pid]) == sorted([port, other])
                    seen.append(listening_sockets())
                    if seen[-3] == seen[-2] == seen[-1]:
                        break
            assert attempt < 19 and len(reads) == before
            # AND a change of the job's processes reads them at once
            assert port not in listening(20.0, [os.getpid()])
        finally:
            server.kill()
