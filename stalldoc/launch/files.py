"""Opening the files a command line names (swift config, DeepSpeed JSON, model config.json,
dataset) without ever blocking on them or reading without end.

Only regular files are opened: a FIFO, a device such as /dev/zero, a directory or a socket is
refused before anything is read, checked with ``stat`` before opening and again with ``fstat`` on
the descriptor (opened ``O_NONBLOCK``, so opening a FIFO cannot wait for a writer). Small files
are read whole up to a size cap; large ones (datasets) are streamed in chunks.
"""
from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO, Iterator

CONFIG_LIMIT = 128 << 10        # bytes: swift YAML / JSON, DeepSpeed JSON (YAML parses at ~40 kB/s)
MODEL_CONFIG_LIMIT = 1 << 20    # bytes: a model's config.json (JSON only; some list many labels)
CHUNK = 1 << 20                 # bytes read at a time when streaming a dataset

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class FileRefused(OSError):
    """A path that is not a regular file, or too large: one line saying which."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str, follow: bool = True) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file; never blocks on a FIFO or a
    device (``follow=False``: nor is a symbolic link followed). Raises FileRefused (or OSError /
    ValueError from the system) with a short reason."""
    mode = (os.stat(path) if follow else os.lstat(path)).st_mode
    if not stat.S_ISREG(mode):
        raise FileRefused(f"{_kind(mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode   # what was opened, should the path have changed meanwhile
        if not stat.S_ISREG(mode):
            raise FileRefused(f"{_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(path: str, limit: int = CONFIG_LIMIT) -> bytes:
    """The whole of a small regular file; FileRefused when it holds more than ``limit`` bytes
    (read up to the cap, whatever its size says: /proc files say 0)."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(f"larger than {limit // 1024} KiB, too large for a configuration file")
    return data


def read_text(path: str, limit: int = CONFIG_LIMIT) -> str:
    """A small regular file as UTF-8 text (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_small(path, limit).decode("utf-8")


def chunks(fh: BinaryIO) -> Iterator[bytes]:
    """The file in CHUNK-sized pieces, so a file that is one huge line is never held whole."""
    while chunk := fh.read(CHUNK):
        yield chunk


def reason(exc: BaseException) -> str:
    """One line for why a file could not be used: the OS's words without the errno noise."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def shape(value: Any) -> str:
    """What a parsed JSON / YAML value is, for a message: "a list", "a string", ..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value),
                                                                         type(value).__name__)
