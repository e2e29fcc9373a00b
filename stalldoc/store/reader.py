"""Open a run database for reading without writing anything into the run directory.

SQLite's read-only mode still creates ``-wal`` / ``-shm`` files beside a WAL database, and cannot
open one in a read-only directory (a copied run) without them. So:

- a WAL database without a ``-wal`` file (the watcher ended cleanly) is opened ``immutable``:
  no lock, no file created;
- one with ``-wal`` and ``-shm`` whose watcher is alive (it holds SQLite's lock on the ``-shm``
  file) in read-only mode, beside it;
- one whose watcher was killed (``-wal`` and ``-shm`` left, nobody holding them) from a private
  copy: SQLite, even read-only, would rebuild the ``-shm`` index in the run directory, and a
  post-mortem must leave its evidence byte for byte as it was;
- a rollback-journal database (network filesystems) in read-only mode;
- anything else (a ``-wal`` without ``-shm``, a hot journal, a read-only copy SQLite refuses) from
  a private copy in a temporary directory, removed afterwards.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import struct
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.request import pathname2url

from stalldoc.errors import RunDirError
from stalldoc.store.schema import DB_NAME, READABLE_VERSIONS, SCHEMA_VERSION

_MAGIC = b"SQLite format 3\x00"
_WAL_VERSION = 2       # header bytes 18-19: 1 = rollback journal, 2 = WAL
_SHM_DMS_BYTE = 128    # (22 + SQLITE_SHM_NLOCK) * 4 + SQLITE_SHM_NLOCK: the -shm's dead-man switch
_FLOCK = "hhqqi4x"     # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid


def _header(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(100)
    except OSError as exc:
        raise RunDirError(f"cannot read {path}: {exc.strerror}") from exc


def _connect(path: Path, query: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{pathname2url(str(path))}?{query}", uri=True)
    conn.row_factory = sqlite3.Row
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()   # opens it for real
    return conn


def _query_for(path: Path, header: bytes) -> str | None:
    """The URI query that reads ``path`` in place without creating files; None: copy it."""
    side = {suffix: Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm", "-journal")}
    if _WAL_VERSION not in header[18:20]:   # write or read version: SQLite goes WAL on either
        return None if side["-journal"] else "mode=ro"
    if not side["-wal"]:
        return "mode=ro&immutable=1"
    return "mode=ro" if side["-shm"] and _held(Path(f"{path}-shm")) else None


def _held(shm: Path) -> bool:
    """Another process has the database open: it holds its shared lock on the ``-shm`` file's
    dead-man-switch byte (SQLite's unix VFS, every connection in WAL mode). Asked with
    ``F_GETLK``, which reads and takes nothing."""
    try:
        fd = os.open(shm, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS_BYTE, 1, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, asked)
        return struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK
    except OSError:
        return True   # cannot tell: read beside it, as before
    finally:
        os.close(fd)


@contextlib.contextmanager
def _copied(path: Path) -> Iterator[sqlite3.Connection]:
    """The database and its journal files, read from a private copy."""
    with tempfile.TemporaryDirectory(prefix="stalldoc-report-") as tmp:
        copy = Path(tmp) / DB_NAME
        for suffix in ("", "-wal", "-journal"):
            if Path(f"{path}{suffix}").exists():
                shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")
        conn = _connect(copy, "mode=rw")
        try:
            yield conn
        finally:
            conn.close()


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[sqlite3.Connection]:
    header = _header(path)
    if not header.startswith(_MAGIC) or len(header) < 100:
        raise RunDirError(f"{path} is not a readable stalldoc database (not a SQLite file)")
    query = _query_for(path, header)
    conn = None
    if query is not None:
        with contextlib.suppress(sqlite3.OperationalError):
            conn = _connect(path, query)
    if conn is None:
        with _copied(path) as copied:
            yield copied
        return
    try:
        yield conn
    finally:
        conn.close()


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or row[0] not in READABLE_VERSIONS:
        found = row[0] if row else "none"
        raise RunDirError(f"{path} has schema version {found}; this stalldoc reads "
                          f"{', '.join(READABLE_VERSIONS)} (writes {SCHEMA_VERSION})")


def _database(run_dir: Path) -> Path:
    try:
        if not Path(run_dir).is_dir():
            raise RunDirError(f"not a directory: {run_dir}")
        path = Path(run_dir) / DB_NAME
        if not path.is_file():
            raise RunDirError(f"no stalldoc run database in {run_dir} (expected {DB_NAME})")
    except OSError as exc:
        raise RunDirError(f"cannot read {run_dir}: {exc.strerror or exc}") from exc
    if not os.access(path, os.R_OK):
        raise RunDirError(f"cannot read {path}: permission denied")
    return path


@contextlib.contextmanager
def open_reader(run_dir: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to RUN_DIR's database, refusing what this version cannot read.
    Damage found while opening it is a RunDirError (one line, exit 1)."""
    path = _database(run_dir)
    try:
        with _opened(path) as conn:
            _check_version(conn, path)
            yield conn
    except sqlite3.DatabaseError as exc:
        raise RunDirError(f"{path} is not a readable stalldoc database ({exc})") from exc
