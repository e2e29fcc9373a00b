"""SD111 hung-in-channel."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.agent import PhaseDetail
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.peer_watch import PeerWatch
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, rank_evidence

CHANNEL_PHASES = ("weight_sync", "rollout_server", "reward_server")

FIX_ROLLOUT = ("The rollout server at {endpoint} takes the request and never answers: read its "
               "log (`swift rollout` / `trl vllm-serve`: a crash, an OOM, a request stuck in its "
               "engine), check that --vllm_server_host / --vllm_server_port (or "
               "--vllm_server_base_url) name that server, and restart it. swift's "
               "--vllm_server_timeout bounds only the first connection check, not a request.")
FIX_SERVER_SYNC = ("The rollout server at {endpoint} does not answer the weight update "
                   "({method}): read its log for the same step; the server must join the "
                   "weight-update group too (its init_communicator), so a server restarted "
                   "alone, or one serving another trainer, leaves this call waiting; check that "
                   "--vllm_server_host / --vllm_server_port name the server this job started.")
FIX_GROUP = ("The NCCL weight-sync group at {endpoint} does not complete ({method}): trainer "
             "and server must join with the same host, group port and world size; a group port "
             "already taken (another job or a stale server: --vllm_server_group_port / "
             "vllm_group_port) or a firewall between them hangs the rendezvous. Rerun with "
             "NCCL_DEBUG=INFO, and set NCCL_SOCKET_IFNAME to the interface both sides reach.")
FIX_REWARD = ("The reward model server at {endpoint} does not answer ({method}): check it (its "
              "deploy log, its load), and give the reward client a timeout and a retry limit.")


def channel_of(window: Window, rank: int) -> PhaseDetail | None:
    """The channel call a rank is in (its innermost phase is a channel phase with a detail)."""
    agent = window.agents.get(rank)
    detail = agent.channel if agent is not None else None
    return detail if detail is not None and detail.phase in CHANNEL_PHASES else None


def duration(seconds: float) -> str:
    """'14 s', '6 min'."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def channel_fix(detail: PhaseDetail) -> str:
    """The fix for the kind of channel the call is in."""
    if detail.phase == "reward_server":
        template = FIX_REWARD
    elif detail.phase == "rollout_server":
        template = FIX_ROLLOUT
    else:
        template = FIX_GROUP if detail.mode == "group" else FIX_SERVER_SYNC
    return template.format(endpoint=detail.endpoint or "?", method=detail.method)


class HungInChannel(Rule):
    """A rank hangs in a weight-sync, rollout or reward server call: which call, which server.

    What it does
        At a stall, looks for ranks whose innermost phase is a channel the agent marks with its
        remote end: ``weight_sync`` (TRL's / swift's VLLMClient init_communicator,
        update_named_param, update_flattened_params..., vLLM's PyNcclCommunicator and
        StatelessProcessGroup.create), ``rollout_server`` (TRL's VLLMClient generate / chat,
        swift's VLLMInferClient infer / check_server) and ``reward_server`` (swift's
        InferClient.infer to a deployed reward model). Names the method, the server or group
        ``host:port`` and how long the call has run.

    Why is this bad?
        In GRPO server mode every step talks to the rollout server twice (weights out,
        completions back); a server that stopped answering, or a weight-sync group one side
        never joined, holds the rank forever, and the other ranks then wait in their next
        collective. The stack alone shows a socket read or a future's wait, not which server.

        When the server is watched too (a second ``stalldoc watch`` of ``swift rollout``,
        ``trl vllm-serve`` or ``vllm serve``, its run directory beside this one), the finding
        quotes what that watch saw on the other side: the exception its job printed last (an
        ``init_communicator`` that raised), its open error findings, or that it ended.

    Evidence
        the rank, its phase, the method, ``server`` or ``group`` and the endpoint, seconds in
        the call, the user frame and frames, the rank's TCP peers outside the job, and the
        other side's watch when found (``peer_watch``: its run directory, state, the error it
        saw, its findings).

    Fix
        Check the server or group the call waits on (its log, its address and port), and give the
        call a timeout so that a dead peer becomes an error instead of a hang.

        Per channel (the finding names the channel and prints its own fix): a rollout server: its
        log and --vllm_server_host / --vllm_server_port; the NCCL weight-sync group: the group port,
        NCCL_DEBUG=INFO and NCCL_SOCKET_IFNAME; a reward server: its health and a client timeout.

    References
        modelscope/ms-swift#4906 (the weight sync to a ``swift rollout`` server: after ``POST
        /update_named_param/ 200 OK`` the communicator's store times out after 300000 ms);
        modelscope/ms-swift#5176 (the first infer request to a rollout server hangs, and times
        out half an hour later); modelscope/ms-swift#4306 (server mode: rank 1 times out in
        ``_ALLGATHER_BASE``; rank 0's wait on the rollout server is not shown); TRL's vllm_client.py (VLLMClient) and
        swift's rlhf_trainers/vllm_client.py; vLLM's distributed/utils.py StatelessProcessGroup.
    """

    code = "SD111"
    name = "hung-in-channel"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        ended = {e.rank for e in window.exits}
        for rank in sorted(r.rank for r in window.ranks if r.rank not in ended):
            detail = channel_of(window, rank)
            if detail is not None:
                yield self._finding(window, rank, detail)

    def _finding(self, window: Window, rank: int, detail: PhaseDetail) -> Finding:
        evidence = rank_evidence(window, rank)
        seconds = max(0.0, window.now - detail.since)
        where = f"; in {evidence['frame']}" if evidence["frame"] else ""
        summary = (f"rank {rank} in {detail.phase}: {detail.describe()}, {duration(seconds)}"
                   f"{where}")
        peer = window.peer_watches.get(rank)
        fix = channel_fix(detail)
        if peer is not None:
            summary += f"; {peer_said(peer)}"
            fix = (f"Start with the other side: {peer_fix(peer)} " + fix)
        return self.finding([rank], summary, {
            **evidence, "channel": detail.phase, "method": detail.method, "mode": detail.mode,
            "endpoint": detail.endpoint, "seconds_in_call": round(seconds, 1),
            "peers": list(window.peers.get(rank, ())),
            "peer_watch": peer_evidence(peer) if peer is not None else None}, fix)


def peer_said(peer: PeerWatch) -> str:
    """What the other side's watch saw, in a clause: "the other side, swift's watch
    (runs/rollout), saw its job raise RuntimeError: ... (its findings: SD523, SD525)"."""
    codes = f" (its findings: {', '.join(f.code for f in peer.findings)})" \
        if peer.findings else ""
    if peer.raised:
        seen = f"saw its job raise {peer.raised}{codes}"
    elif peer.findings:
        seen = f"has [{peer.findings[-1].code}] {peer.findings[-1].summary}{codes}"
    else:
        seen = "saw no error there"
    if peer.state == "ended":
        code = f" with exit code {peer.exit_code}" if peer.exit_code is not None else ""
        seen += f"; its job ended{code}"
    elif peer.silent_for > 60:
        seen += f"; that watch has been silent for {peer.silent_for:.0f} s"
    elif not (peer.raised or peer.findings):
        seen += "; its job runs" + (", stalled" if peer.stalled else "")
    return f"the other side, {peer.where}, {seen}"


def peer_fix(peer: PeerWatch) -> str:
    if peer.raised or peer.findings:
        return (f"the server's side failed to do its part (the error quoted, in full in "
                f"`stalldoc report {peer.run_dir}`); fix that and restart the server, then "
                "the trainer.")
    if peer.state == "ended":
        return "the server's job ended: restart it, then the trainer."
    return (f"the server's side shows no error; read `stalldoc report {peer.run_dir}` for what "
            "its job did at that time.")


def peer_evidence(peer: PeerWatch) -> dict:
    return {"run_dir": peer.run_dir, "host": peer.host, "program": peer.program,
            "state": peer.state, "raised": peer.raised, "raised_ago": peer.raised_ago,
            "exit_code": peer.exit_code, "stalled": peer.stalled,
            "silent_for": round(peer.silent_for, 1),
            "findings": [f"{f.code} {f.severity}: {f.summary}" for f in peer.findings]}
