"""SD107 waiting-on-server."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.stacks import frame_strings, server_wait, waits_on_network
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.served import JobServer
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, blamed, describe, rank_evidence
from stalldoc.rules.sd111_hung_in_channel import channel_of


class WaitingOnServer(Rule):
    """A rank is blocked on a reply from a server (reward model, rollout server, an API).

    What it does
        At a stall, looks for ranks whose main thread sits in a socket, HTTP or RPC client
        (socket, ssl, http.client, urllib, requests, urllib3, httpx, aiohttp, grpc, openai), or
        waits on a future, a queue or a lock of its own while another of its threads sits in
        one (a client that posts from an executor thread), and names the server: from the
        rank's established TCP connections outside the job, or, where the server is the job's
        own (a process below a rank that serves HTTP: a reward model or rollout server a
        trainer started), by its pid, command and URL with the requests it holds unanswered. A
        server the rank waits on in a plain HTTP client that serves vLLM's metrics
        (``/metrics``, read once at the diagnosis) is named as a vLLM server, with its running
        and waiting requests, KV-cache usage and tokens generated. A rank in a marked channel
        call (weight sync, rollout or reward server) is left to SD111, which names the call and
        the server from the client itself.

    Why is this bad?
        A reward function or rollout call without a timeout waits forever for a server that is
        down, overloaded or unreachable; the other ranks then wait for this one in their next
        collective, the GPUs idle, and nothing is logged.

    Evidence
        the rank, the user frame that made the call, the network frames, the server's
        ``host:port`` peers, the job's own servers it waits on (``job_servers``: pid, rank,
        URL, command, requests held, the thread that handles one), a vLLM server's metrics by
        peer (``vllm_servers``), phase, seconds without progress; ``thread``, when the call
        waits on a thread of its own; ``blamed`` (pid, what): the job's servers that hold
        requests they have not answered.

    Fix
        Check that the server is up and answering on that address (is the port right?); give the
        client call a timeout and a retry limit so that a dead server becomes an error instead of a
        hang.
        A server of the job's own that holds the request: take its stack (``py-spy dump
        --pid``) to see what it waits for (a batcher waiting for a full batch, an engine that
        stopped stepping, a lock).

    References
        modelscope/ms-swift#5176 (the first infer request to a ``swift rollout`` server with
        DP 2 hangs, and times out half an hour later); modelscope/ms-swift#9143 (a reward
        function that calls a remote vLLM service; the thread does not place the hang in that
        call); modelscope/ms-swift#4306 (server mode: rank 1 times out in ``_ALLGATHER_BASE``;
        rank 0 is not shown, and a wait on the rollout server is a reading of it).
    """

    code = "SD107"
    name = "waiting-on-server"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, stacks in sorted(window.stacks.items()):
            thread = server_wait(stacks)
            frame = waits_on_network(thread)
            if thread is None or frame is None or channel_of(window, rank) is not None:
                continue   # SD111 names the channel call, with these peers in its evidence
            if rank in window.served:
                continue   # a server in its event loop waits for its clients: SD117's
            peers = list(window.peers.get(rank, ()))
            servers = window.job_servers.get(rank, ())
            named = [s.describe() for s in servers] + peers
            server = f" from {'; '.join(named)}" if named else ""
            vllm = {p: window.peer_servers[p] for p in peers if p in window.peer_servers}
            said = "".join(f", a vLLM server (its metrics, as of its engine's last finished "
                           f"step: {m.describe()})" for m in list(vllm.values())[:1])
            helper = thread is not stacks.main
            on = (f" in its thread {thread.name or thread.thread_id} at {frame}, which its main "
                  "thread waits on" if helper else "")
            summary = (f"rank {rank} waits for a server's reply{server}{said}{on}; "
                       f"{describe(window, rank)}")
            evidence = {**rank_evidence(window, rank), "peers": peers}
            if servers:
                evidence["job_servers"] = [s.as_dict() for s in servers]
                evidence.update(blamed((s.pid, s.place) for s in servers if s.in_flight))
            if helper:
                evidence.update(frame=str(frame), frames=frame_strings(thread),
                                thread=thread.name or str(thread.thread_id))
            if vllm:
                evidence["vllm_servers"] = {p: m.as_dict() for p, m in vllm.items()}
            yield self.finding([rank], summary, evidence, _fix(servers))


def _fix(servers: tuple[JobServer, ...]) -> str | None:
    """For a server of the job's own that holds requests: its stack first (the code's own fix
    is for a server the rank cannot reach)."""
    held = [s for s in servers if s.in_flight]
    if not held:
        return None
    pids = ", ".join(str(s.pid) for s in held)
    return (f"The server holds the request and does not answer: take its stack (`py-spy dump "
            f"--pid {pids}`) to see what it waits for (a batcher waiting for a full batch, an "
            "engine that stopped stepping, a lock); give the client call a timeout so that a "
            "hung server becomes an error in the trainer, not a silent wait.")
