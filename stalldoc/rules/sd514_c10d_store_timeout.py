"""SD514 c10d-store-timeout."""
from __future__ import annotations

import re
from typing import Any

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature

# who waits on the store, read from the key or the message
_WAITERS = (
    (re.compile(r"/broadcast_from/|/send_to/"),
     "a vLLM StatelessProcessGroup (the trainer <-> rollout weight-sync communicator)"),
    (re.compile(r"ncclUniqueId|//cuda//"), "NCCL communicator setup (ncclUniqueId from rank 0)"),
    (re.compile(r"clients joined|workers joined"), "rendezvous (the TCPStore server waits for ranks)"),
    (re.compile(r"store based barrier"),
     "init_process_group's store-based barrier (torch < 2.1: every rank must arrive)"),
    (re.compile(r"trying to connect to|any network address|C10d store has failed"),
     "rendezvous (this rank cannot reach the TCPStore server)"),
)


class C10dStoreTimeout(LogSignature):
    """A wait on torch.distributed's key-value store (TCPStore) timed out.

    What it does
        Matches ``torch.distributed.DistStoreError: wait timeout after Nms, keys: /...``,
        ``Timed out after N seconds waiting for clients. A/B clients joined.``, ``... is setting
        up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key
        'K', but store->get('K') got error: ...``, ``[c10d] waitForInput: socket ... timed out
        after Nms``, the older ``Socket Timeout``, torch < 2.1's barrier in init_process_group
        (``Timed out initializing process group in store based barrier on rank: R, for key:
        store_based_barrier_key:N (world_size=W, worker_count=C, timeout=0:30:00)``), and a store
        that never answered at all: ``[c10d] The client socket has timed out after 60s while
        trying to connect to HOST:PORT`` or ``to (HOST, PORT)`` (also as ``DistNetworkError`` /
        ``TimeoutError`` and inside ``TCP client failed to connect/validate to host``), ``The
        client socket has failed to connect to any network address of (...)`` and torchrun's
        ``RendezvousConnectionError: The connection to the C10d store has failed``. The barrier's
        ``Waiting in store based barrier to initialize process group ...`` is no finding: it is
        printed every few seconds while ranks are still starting, and its timeout line follows
        when they never come.

    Why is this bad?
        A rank waited for a key that its peer never wrote: the peer is stuck, dead, or never got
        there. Keys ``/broadcast_from/<rank>/<n>`` are vLLM's StatelessProcessGroup: the
        weight-sync communicator between the trainer and a vLLM / SGLang server (TRL, swift
        ``vllm_client``, OpenRLHF) lost its other side (server restarted, crashed, or busy in a
        long generation). ncclUniqueId keys: a rank is late to create the NCCL communicator
        (rank 0 still loading, or another branch). ``clients joined``: ranks never reached the
        rendezvous. The store-based barrier: ``worker_count`` ranks of ``world_size`` arrived;
        a count above ``world_size`` means more processes joined than the group has (two jobs on
        one MASTER_PORT, a script that spawns its own workers under a launcher that already did,
        a requeued job meeting its previous store).

    Evidence
        the lines; ``timeout_ms`` / ``waited_seconds`` / ``waited`` / ``timeout``, ``keys`` /
        ``key``, ``joined`` / ``expected`` (clients), ``world_size`` / ``worker_count`` /
        ``barrier_rank`` (the barrier; the printing rank, named in words), ``peer`` (the store's
        HOST:PORT), ``waiting_for`` (who waits on the store); the global ranks that printed them.

    Fix
        The key says which: ``/broadcast_from/`` (the weight-sync communicator with a vLLM / SGLang
        server lost its peer): check that the server is alive, restart both sides together.
        ``ncclUniqueId``: find what rank 0 was doing. Clients joined / store-based barrier /
        cannot connect: the same --nnodes / MASTER_ADDR / MASTER_PORT on every node, reachable
        from all.

        ``/broadcast_from/``: read the rollout server's own log (stalldoc's SD107 / SD507);
        restarting it together with the trainer makes both sides recreate the communicator; use one
        server per trainer group. ``ncclUniqueId``: the stall finding says where rank 0 is; raise
        the store timeout (``init_process_group(timeout=)``, swift / HF ``--ddp_timeout``) only for
        legitimately slow starts. Cannot connect: MASTER_ADDR / ``--rdzv-endpoint`` must be an
        address of rank 0's node that the others reach (``nc -zv ADDR PORT``; ``0.0.0.0`` or
        ``127.0.0.1`` only reach the same node), rank 0 must be up, no firewall on the port.
        Store-based barrier with ``worker_count`` below ``world_size``: the missing ranks never
        called init_process_group (crashed or still loading: their own log); above: a port
        shared with another job or processes started twice (a fresh MASTER_PORT per job).

    References
        modelscope/ms-swift#4906 (``/broadcast_from/0/75465`` in swift's vllm_client weight
        sync), OpenRLHF/OpenRLHF#1040 (1/3 clients joined), huggingface/open-r1#690
        (waitForInput timed out in a swift GRPO run), NVIDIA-NeMo/Speech#14399 and
        hiyouga/LlamaFactory#3698 (ncclUniqueId), pytorch/pytorch#107177, pytorch/pytorch#55571
        (``Socket Timeout``: before pytorch/pytorch#131808 the timeout named no key),
        pytorch/pytorch#107021 (timed out after 60s while trying to connect; the rendezvous
        failed), hpcaitech/Open-Sora#667 (failed to connect to any network address),
        pytorch/pytorch#79388 and pytorch/pytorch#105782 (``to (IP, PORT)``: the address in
        parentheses), vllm-project/vllm#19670 (also inside ``TCP client failed to
        connect/validate``), vllm-project/vllm#17527 (TRL's vLLM at ``(0.0.0.0, 37589)``),
        nvidia-cosmos/cosmos-rl#681 and lllyasviel/ControlNet#382 (``DistNetworkError`` /
        ``TimeoutError``), facebookresearch/metaseq#52 (the store-based barrier: 1792 of 2048
        ranks; the ``Waiting in store based barrier`` lines are a commenter's smaller run), deepspeedai/Megatron-DeepSpeed#338
        (4 of 8), epfml/powersgd#21 (4 of 2: more joined than the group has),
        ultralytics/yolov5#4574 (the waiting line, repeated).
    """

    code = "SD514"
    name = "c10d-store-timeout"
    severity = Severity.CRITICAL
    headline = "c10d store timeout"
    patterns = (
        r"is setting up NCCL communicator and retr(?:ie|ei)ving ncclUniqueId from \[(?P<root>\d+)\] "
        r"via c10d key-value store by key '(?P<key>[^']*)', but store->get\('[^']*'\) got "
        r"(?:error|exception): (?P<store_error>.+)",
        r"wait timeout after (?P<timeout_ms>\d+) ?ms, keys: (?P<keys>\S+)",
        r"Timed out after (?P<waited_seconds>\d+) seconds waiting for (?:clients|workers)\. "
        r"(?P<joined>\d+)/(?P<expected>\d+) (?:clients|workers) joined",
        r"\[c10d\] waitForInput: socket .*timed out after (?P<timeout_ms>\d+) ?ms",
        r"Timeout waiting for key: (?P<key>\S+) after",
        r"(?:DistStoreError|RuntimeError): Socket Timeout",
        r"The client socket has timed out after (?P<waited>\w+) while trying to connect to "
        r"(?:\((?P<host>[^,()]+), (?P<port>\d+)\)|(?P<peer>[^\s(]+))",
        r"The client socket has failed to connect to any network address of \((?P<peer>[^)]*)\)",
        r"RendezvousConnectionError: The connection to the C10d store has failed",
        r"Timed out initializing process group in store based barrier on rank:? (?P<barrier_rank>"
        r"\d+), for key: (?P<key>\S+) \(world_size=(?P<world_size>\d+), worker_count="
        r"(?P<worker_count>\d+), timeout=(?P<timeout>[^)]+)\)",
    )

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        figures = super().details(match)
        if "host" in figures and "port" in figures:     # "(172.17.0.9, 50437)": one figure
            figures["peer"] = f"{figures.pop('host')}:{figures.pop('port')}"
        waiter = next((who for pattern, who in _WAITERS if pattern.search(match.string)), None)
        return {**figures, "waiting_for": waiter} if waiter else figures
