"""Watches that meet beside each other: every ``stalldoc watch`` writes a small card into its run
directory (``peer.json``: what its job listens on, the error it printed last, its open error
findings, whether it ended), and a watch whose rank waits on a server or a weight-sync group
looks for the card of the watch that serves it among the run directories beside its own (the
same parent: ``./stalldoc-runs`` by default, or the ``--run-dir`` parent both were given; for a
multi-node job's node directories, one level deeper).

A card is untrusted input (another user's run on a shared filesystem, a truncated write): its
size is bounded, every field is checked, and a card that is not one is skipped whole. What it
quotes of its job was redacted by the watch that wrote it, and is redacted again here."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.launch import LaunchConfig
from stalldoc.model.peer_watch import PeerFinding, PeerWatch
from stalldoc.private_files import write_private_file
from stalldoc.redact import redact_text

CARD_FILE = "peer.json"
FORMAT = 1
MAX_BYTES = 64 << 10
MAX_TEXT = 500
MAX_ITEMS = 64
MAX_DIRS = 500        # run directories looked at (the newest first)
_LOCAL = frozenset({"::1", "localhost", "0.0.0.0", "::"})


def is_loopback(address: str) -> bool:
    """An address that means this host wherever it is written (a card's host is not ours)."""
    return address in _LOCAL or address.startswith(("127.", "::ffff:127."))


def encode(card: dict[str, Any]) -> bytes:
    return json.dumps({"format": FORMAT, **card}, separators=(",", ":")).encode()


def write_card(run_dir: Path, card: dict[str, Any]) -> None:
    """Replace this watch's card (OSError raised: the caller counts it)."""
    write_private_file(run_dir, CARD_FILE, encode(card))


def read_cards(run_dir: Path, shared: Path | None = None, now: float | None = None
               ) -> tuple[PeerWatch, ...]:
    """The cards of the other watches beside ``run_dir`` (its own left out); ``shared``: the
    shared run directory of a multi-node job whose node directory ``run_dir`` is."""
    now = time.time() if now is None else now
    own = run_dir.resolve()
    found = []
    for path in _card_paths(run_dir, shared):
        if path.parent.resolve() == own:
            continue
        card = _read(path, now)
        if card is not None:
            found.append(card)
    return tuple(found)


def _card_paths(run_dir: Path, shared: Path | None) -> list[Path]:
    """peer.json files in the run directories beside ``run_dir``, and for a node of a
    multi-node job in the node directories of the shared run directories beside its own, the
    newest first."""
    candidates = [entry / CARD_FILE for entry in _entries(run_dir.parent)]
    if shared is not None:
        candidates += [node / CARD_FILE for entry in _entries(shared.parent)
                       for node in _entries(entry)]
    paths: list[tuple[float, Path]] = []
    for candidate in candidates:
        try:
            paths.append((candidate.stat().st_mtime, candidate))
        except OSError:
            continue
    return [p for _, p in sorted(paths, reverse=True)[:MAX_DIRS]]


def _entries(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as listing:
            return [Path(e.path) for e in listing if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _read(path: Path, now: float) -> PeerWatch | None:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        mtime = os.stat(path).st_mtime
        if len(raw) > MAX_BYTES:
            return None
        return decode(json.loads(raw), str(path.parent), max(0.0, now - mtime))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def decode(data: Any, run_dir: str, silent_for: float) -> PeerWatch:
    """A card's fields, checked; ValueError / TypeError / KeyError for anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a card of this format")
    findings = tuple(PeerFinding(_text(f["code"], 16), _text(f["severity"], 16),
                                 _text(f["summary"])) for f in _items(data.get("findings", [])))
    return PeerWatch(run_dir, _text(data["host"], 255), tuple(
        _text(a, 64) for a in _items(data.get("addresses", []))), _text(data.get("program", ""),
                                                                          64),
        _choice(data["state"], ("running", "ended")), silent_for,
        tuple(_port(p) for p in _items(data.get("listening", []))), findings,
        _text(data.get("raised", "")), _number(data.get("raised_ago")),
        _int(data.get("exit_code")), bool(data.get("stalled", False)))


def matching(cards: Iterable[PeerWatch], endpoints: Iterable[str], host: str
             ) -> PeerWatch | None:
    """The card of the watch whose job listens on one of ``endpoints`` (``host:port``, as this
    host sees them: a loopback address is this host), the freshest first."""
    wanted = [_split(e) for e in endpoints]
    for card in sorted(cards, key=lambda c: c.silent_for):
        names = {card.host, *card.addresses}
        for address, port in wanted:
            if port in card.listening and (card.host == host if is_loopback(address)
                                           else address in names):
                return card
    return None


def endpoints_of(agent: AgentSnapshot | None, peers: Iterable[str],
                 config: LaunchConfig | None) -> list[str]:
    """Where a rank in a weight-sync, rollout or reward call waits: the call's endpoint, the
    rank's TCP peers outside the job (a client's kept-alive connection to its server) and the
    server its command line names (``--vllm_server_host`` / ``--vllm_server_port``); none for
    a rank in no such call."""
    detail = agent.channel if agent is not None else None
    if detail is None:
        return []
    found = [detail.endpoint.split()[0]] if detail.endpoint else []
    found += list(peers)
    host = config.value("vllm_server_host") if config is not None else None
    port = config.value("vllm_server_port") if config is not None else None
    if host and port:
        found += [f"{h}:{p}" for h in host.split() for p in port.split()]
    return found


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    return host, int(port) if port.isdigit() else -1


def _items(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("a list was expected")
    return value[:MAX_ITEMS]


def _text(value: Any, most: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise TypeError("a string was expected")
    return redact_text(value[:most])


def _choice(value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"one of {allowed} was expected")
    return value


def _port(value: Any) -> int:
    if not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError("a port was expected")
    return value


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("an integer was expected")
    return value


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise TypeError("a number was expected")
    return float(value)
