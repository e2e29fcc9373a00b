"""The parts of a failure line, whoever printed it: pid, ranks, signal, exit code, errno, host,
port, URL, GPU. Each kind of failure (``log_kind.py``) reads a line with these, so a new wording of
a known kind still gives its parts.

Only what the line itself says: a part the line does not carry is absent, never guessed. A
global ``rank`` only where the line says so (``line_rank``: torch's ``[rankN]:``, the default
group's tag, a bare ``[Rank N]``; mpirun's ``process rank N``, which is the MPI world rank); a
launcher's ``local_rank`` is a rank on its node. A URL is kept without its credentials, query
and fragment (a signed URL's signature is a credential too).
"""
from __future__ import annotations

import re
import signal
from typing import Any, Callable

from stalldoc.rules.log_signature import line_rank

# what ``strsignal`` prints (DataLoader's "killed by signal: Killed", a shell's "Bus error")
_SIGNAL_WORDS = {"killed": "SIGKILL", "segmentation fault": "SIGSEGV", "bus error": "SIGBUS",
                 "aborted": "SIGABRT", "terminated": "SIGTERM", "hangup": "SIGHUP",
                 "interrupt": "SIGINT", "floating point exception": "SIGFPE",
                 "illegal instruction": "SIGILL", "已杀死": "SIGKILL"}
_PID = re.compile(r"\bpid(?:\(s\))?(?:\s*[:=]\s*|\s+)(\d+)|\bPID[:=]? ?(\d+)"
                  r"|\b(?:Killed|reaped) process (\d+)|\bline \d+: +(\d+) [A-Z]"
                  r"|\bProcess (\d+) got signal")
# NCCL's own prefix: ``host:pid:tid [cuda device]``
_NCCL_PREFIX = re.compile(r"(?:^|[\s:>)\]])([\w.-]+):(\d+):\d+ \[(\d+)\] ")
# the node a launcher names: mpirun's ``on node X``, srun's ``error: X: task``, Slurm's ``ON X``,
# Ray's ``ip=X``
_NODE = re.compile(r"\bon node (\S+) exited|\bsrun: error: ([^\s:]+): tasks? "
                   r"|\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED|\bip=([\d.]+)|\bConnection to ([\w.-]+) timed out")
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+(?:, ip=[^)\s]+)?\) ")
_LOCAL_RANK = re.compile(r"\blocal_rank\s*[:=]\s*(\d+)")
_MPI_RANK = re.compile(r"\bprocess rank (\d+)\b")
_SIGNAL_NAME = re.compile(r"\b(SIG[A-Z]{2,6})\b")
_SIGNAL_NUMBER = re.compile(r"\b[Ss]ignal:? (\d{1,2})\b|\bReceived (\d{1,2}) death signal")
_SIGNAL_WORD = re.compile(r"\b(?:by |on |with )?signal:? ([A-Za-z][A-Za-z ]+?)(?:[.;,)]|$)"
                          r"|(?:^|: ?|\d +|\) |Fatal Python error: )"
                          r"(Killed|Segmentation fault|Aborted|Bus error|已杀死)(?: \(core dumped\))?(?: |$)")
_EXIT_CODE = re.compile(r"\bexit ?code(?:\s*[:=]\s*|\s+)\(?(-?\d+)|return ?code\s*[:=]?\s*(-?\d+)"
                        r"|\bexit status (-?\d+)|\bexited with (?:code|status) (-?\d+)"
                        r"|\bexitcode\s*:\s*(-?\d+)"
                        r"|(?:^|[\s:>)\]]|exit code )(\d+) \(interrupted by signal")
_ERRNO = re.compile(r"\[Errno (\d+)\]|\berrno[ =:]+(\d+)|\bError code (\d+) \(")
_HOST_PORT = re.compile(r"host='([^']+)', port=(\d+)")
_ADDRESS = re.compile(r"\b((?:\d{1,3}\.){3}\d{1,3}):(\d{2,5})\b")
_URL = re.compile(r"\b(https?|s3|gs|wss?)://([^\s'\"<>)\],]+)")
_HTTP_STATUS = re.compile(r"\b(4\d\d|5\d\d) (?:Client|Server) Error\b|<Response \[(\d{3})\]>"
                          r"|\b[Ss]tatus(?: code)?[ =:]+(\d{3})\b|\bHTTP (?:Error )?(\d{3})\b"
                          r"|\btoo many (\d{3}) error responses")
_XID = re.compile(r"\bXid (?:\(PCI:[0-9a-fA-F:.]+\))?:? ?(\d+)")
_PCI = re.compile(r"\bPCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})")


def parts(text: str) -> dict[str, Any]:
    """Every part ``text`` carries (pid, rank, local_rank, signal, exit_code, errno, host, port,
    url, http_status, xid, device), after Ray's prefix (the pid that printed the line, not the
    one it speaks of)."""
    text = _RAY_PREFIX.sub("", text, count=1)
    found: dict[str, Any] = {}
    for reader in _READERS:
        found.update(reader(text))
    return found


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    if match is None:
        return None
    return next(group for group in match.groups() if group is not None)


def _ids(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if (nccl := _NCCL_PREFIX.search(text)) is not None:
        out["host"], out["pid"], out["device"] = nccl[1], int(nccl[2]), int(nccl[3])
    if (pid := _first(_PID, text)) is not None:
        out["pid"] = int(pid)
    rank = line_rank(text)
    if rank is None and (mpi := _first(_MPI_RANK, text)) is not None:
        rank = int(mpi)
    if rank is not None:
        out["rank"] = rank
    if (local := _first(_LOCAL_RANK, text)) is not None:
        out["local_rank"] = int(local)
    return out


def _ending(text: str) -> dict[str, Any]:
    """The exit code and the signal: a negative exit code (Popen's -N) is signal N."""
    out: dict[str, Any] = {}
    code = _first(_EXIT_CODE, text)
    if code is not None:
        out["exit_code"] = int(code)
    name = signal_name(text)
    if name is None and code is not None and int(code) < 0:
        name = _name_of(-int(code))
    if name is not None:
        out["signal"] = name
    return out


def signal_name(text: str) -> str | None:
    """The signal a line names: ``SIGKILL``, ``signal 9``, ``signal: Killed``."""
    if (name := _first(_SIGNAL_NAME, text)) is not None:
        return name
    if (number := _first(_SIGNAL_NUMBER, text)) is not None:
        return _name_of(int(number))
    word = _first(_SIGNAL_WORD, text)
    return _SIGNAL_WORDS.get(word.strip().lower()) if word else None


def _name_of(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _place(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    match = _HOST_PORT.search(text) or _ADDRESS.search(text)
    if match is not None:
        out["host"], out["port"] = match.group(1), int(match.group(2))
    elif (node := _first(_NODE, text)) is not None:
        out["host"] = node
    if (url := _URL.search(text)) is not None:
        out["url"] = clean_url(url.group(1), url.group(2))
        host, _, port = out["url"].split("://", 1)[1].split("/", 1)[0].partition(":")
        out.setdefault("host", host)
        if port.isdigit():
            out.setdefault("port", int(port))
    if (status := _first(_HTTP_STATUS, text)) is not None:
        out["http_status"] = int(status)
    return out


def clean_url(scheme: str, rest: str) -> str:
    """``scheme://rest`` without credentials, query or fragment."""
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}".rstrip(".:;")


def _system(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if (errno := _first(_ERRNO, text)) is not None:
        out["errno"] = int(errno)
    if (xid := _first(_XID, text)) is not None:
        out["xid"] = int(xid)
    if (pci := _first(_PCI, text)) is not None:
        out["device"] = pci
    return out


_READERS: tuple[Callable[[str], dict[str, Any]], ...] = (_ids, _ending, _place, _system)
