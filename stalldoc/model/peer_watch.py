"""Another ``stalldoc watch`` beside this one: the watch of a rollout server (``swift rollout``,
``trl vllm-serve``, ``vllm serve``) started apart from the trainer's, as it last published itself
in its run directory (``cluster/peer_card.py``). A trainer's rank that waits on a server or a
weight-sync group is followed to that side when its watch is found: what it saw there (an
error its job printed, its open findings, its exit) is quoted in the trainer's finding."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeerFinding:
    """An open finding of the other watch (error or critical)."""

    code: str
    severity: str
    summary: str


@dataclass(frozen=True)
class PeerWatch:
    """The other watch's card, as read now."""

    run_dir: str                    # where it is (the report of that side)
    host: str
    addresses: tuple[str, ...]      # its host's IP addresses
    program: str                    # the watched command's program (``swift``, ``vllm``)
    state: str                      # running / ended
    silent_for: float               # seconds since it last wrote its card
    listening: tuple[int, ...]      # TCP ports its job's processes listen on
    findings: tuple[PeerFinding, ...] = ()
    raised: str = ""                # the last exception its job printed (redacted), if any
    raised_ago: float | None = None  # seconds before the card was written
    exit_code: int | None = None
    stalled: bool = False

    @property
    def where(self) -> str:
        return f"{self.program or 'its job'}'s watch ({self.run_dir})"
