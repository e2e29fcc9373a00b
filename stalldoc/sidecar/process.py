"""The sidecar: everything of ``stalldoc watch`` that can fail (probes, py-spy, rules, SQLite,
the metrics server) in a process of its own, started by the relay (``relay/relay.py``).

If it crashes, hangs, runs out of memory or is killed, the job and its output go on: the relay
never waits on it. It volunteers to be the first process the kernel's OOM killer takes.
Run as ``python -m stalldoc.sidecar IN_FD OUT_FD SRC:DST,...`` by the relay only.
"""
from __future__ import annotations

import sys
import threading
import traceback
from types import TracebackType

from stalldoc.run.options import WatchOptions
from stalldoc.redact import redact_text
from stalldoc.sidecar.link import RelayLink


def first_to_go_on_oom() -> None:
    """Under memory pressure the kernel kills us, never the job (raising is unprivileged)."""
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write("1000")
    except OSError:
        pass


def redact_uncaught() -> None:
    """Exceptions nothing caught (in any thread) go to stderr, ``sidecar.log``, as Python prints
    them, but redacted: their messages may quote the job's output or command line."""
    sys.excepthook = _write_redacted
    threading.excepthook = _thread_excepthook


def _write_redacted(kind: type[BaseException], value: BaseException | None,
                    tb: TracebackType | None) -> None:
    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, value, tb))))
    sys.stderr.flush()


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is not SystemExit:
        _write_redacted(args.exc_type, args.exc_value, args.exc_traceback)


def _streams(arg: str) -> list[tuple[int, int]]:
    pairs = [part.split(":") for part in arg.split(",") if part]
    return [(int(source), int(target)) for source, target in pairs]


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write("stalldoc.sidecar is started by `stalldoc watch` only\n")
        return 2
    first_to_go_on_oom()
    redact_uncaught()
    from stalldoc.sidecar.watcher import Watcher

    link = RelayLink(int(argv[1]), int(argv[2]), _streams(argv[3]))
    link.options_ready.wait()
    if not link.options:
        return 0
    watcher = Watcher(WatchOptions.from_dict(link.options), link)
    code = watcher.run()
    link.reader.join(timeout=5)   # the output it may have taken over, to its last byte
    return code

