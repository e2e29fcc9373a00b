"""Files and directories made inside a private directory (a run directory, a node's
subdirectory) without following anything that may already sit at the name: a link planted there
is replaced, never written through. A leaf: the standard library only, so the stages (probes,
cluster) and the processes alike can write into the run directory.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def private_subdir(directory: Path, name: str) -> Path:
    """``directory/name``, made mode 0700 or found as a real directory of ours (made 0700);
    a link or another user's directory at the name is refused (OSError)."""
    fd = os.open(directory, DIR_FLAGS)
    try:
        try:
            os.mkdir(name, PRIVATE_DIR, dir_fd=fd)
        except FileExistsError:
            pass
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EEXIST, f"{directory / name} exists and is not a directory of "
                                        f"ours")
        os.chmod(name, PRIVATE_DIR, dir_fd=fd)
    finally:
        os.close(fd)
    return directory / name


def write_private_file(directory: Path, name: str, data: bytes) -> None:
    """``directory/name`` holding ``data``, mode 0600: written to a new file (O_EXCL, so never
    through a link) that then takes the name from whatever had it (a link is replaced, not
    followed)."""
    def make(fd: int, temp: str) -> None:
        out = os.open(temp, _NEW_FILE, PRIVATE_FILE, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            os.fchmod(out, PRIVATE_FILE)
        finally:
            os.close(out)
    _replace(directory, name, make)


def replace_symlink(directory: Path, name: str, points_to: Path) -> None:
    """``directory/name``: a symbolic link to ``points_to``, replacing whatever had the name."""
    _replace(directory, name, lambda fd, temp: os.symlink(points_to, temp, dir_fd=fd))


def _replace(directory: Path, name: str, make: Callable[[int, str], None]) -> None:
    fd = os.open(directory, DIR_FLAGS)
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        make(fd, temp)
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=fd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
