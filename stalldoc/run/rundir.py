"""The run directory, out of every other user's reach (a shared login node).

``PYTHONPATH`` names ``RUN_DIR/bootstrap`` to every Python process of the job for as long as it
runs, and the path is looked up again each time: whoever can rename or replace a directory on
it can make the job run code of theirs, as the job's user. So a run directory is only used where
no other user can change the path to it:

- The path as given is resolved once (its symbolic links followed); from then on only the
  resolved path is used, and every directory on it is opened with ``O_NOFOLLOW``, so a
  directory swapped for a link after resolving is refused, never followed.
- Every directory from ``/`` down to the run directory's parent must be owned by us or by root,
  and not writable by other users unless it has the sticky bit (like ``/tmp``: others may add
  entries there, but cannot rename or remove ours). Writable by its group counts as writable by
  others, except for our own user private group (named like us, our primary group, no other
  members) on a directory without an ACL. Missing directories are created, mode 0700.
- The run directory itself is created with ``mkdir`` (which never follows a link), or is an
  existing empty directory; either way it must be a real directory owned by us, and it is then
  made mode 0700 (a directory that is not empty is refused untouched).

A run directory that holds a stalldoc run already is refused too, but for a requeue: when Slurm
runs the job again (``SLURM_RESTART_COUNT`` of 1 or more: ``sbatch --requeue``, Lightning's
auto-requeue), the run before it is set aside in ``attempt-N`` inside the directory (N = 1, 2, ...)
and the new one starts beside it, so a job script's fixed ``--run-dir`` holds every attempt.

A path that breaks a rule is refused before anything starts, in one line naming the directory,
why, and what to do (exit 125). What goes inside the run directory is created by
``stalldoc/private_files.py``, without following anything that may already sit at the name.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import re
import stat
from pathlib import Path
from typing import Mapping

from stalldoc.errors import StalldocError
from stalldoc.private_files import DIR_FLAGS as _DIR_FLAGS
from stalldoc.private_files import PRIVATE_DIR
from stalldoc.store.schema import DB_NAME
_ACL = "system.posix_acl_access"
_ELSEWHERE = "or use --run-dir somewhere only you can write"
REQUEUE_COUNT = "SLURM_RESTART_COUNT"
_ATTEMPT = re.compile(r"attempt-([1-9]\d*)")


class UnsafeRunDir(StalldocError):
    """A run directory another user could redirect; nothing was started (exit 125)."""


# ----- the rules ------------------------------------------------------------------------------
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _has_acl(fd: int) -> bool:
    """Whether the directory behind ``fd`` has an access ACL (unreadable: assume it has)."""
    try:
        os.getxattr(f"/proc/self/fd/{fd}", _ACL)
    except OSError as exc:
        return exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
    return True


def private_group(gid: int, uid: int, fd: int) -> bool:
    """``gid`` is the user private group of ``uid`` and the directory ``fd`` has no ACL (whose
    mask would show as group write while naming other users)."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    members = set(group.gr_mem) - {user.pw_name}
    return (group.gr_name == user.pw_name and user.pw_gid == gid and not members
            and not _has_acl(fd))


def unsafe_reason(st: os.stat_result, fd: int, path: Path, uid: int) -> str | None:
    """Why another user could rename or replace the entries of directory ``path`` (its stat
    ``st``, an open ``fd``), with what to do; None when no other user can."""
    if st.st_uid not in (uid, 0):
        return (f"{path} is owned by {user_name(st.st_uid)}, who could swap the run directory "
                f"for one of theirs; {_ELSEWHERE}")
    if st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return (f"{path} is writable by every user and has no sticky bit, so another user could "
                f"swap the run directory for one of theirs; chmod o-w {path} (or chmod +t "
                f"{path}), {_ELSEWHERE}")
    if st.st_mode & stat.S_IWGRP and not private_group(st.st_gid, uid, fd):
        return (f"{path} is writable by group {_group_name(st.st_gid)} and has no sticky bit, "
                f"so another member could swap the run directory for one of theirs; chmod g-w "
                f"{path} (or chmod +t {path}), {_ELSEWHERE}")
    return None


# ----- the run directory ----------------------------------------------------------------------
def requeued(env: Mapping[str, str]) -> bool:
    """Slurm runs this job again (``SLURM_RESTART_COUNT`` of 1 or more)."""
    value = env.get(REQUEUE_COUNT, "")
    return value.isdigit() and int(value) > 0


def earlier_attempts(run_dir: Path) -> list[str]:
    """The runs set aside in ``run_dir`` by requeues (``attempt-1``, ...), in order."""
    try:
        return _attempt_names(os.listdir(run_dir))
    except OSError:
        return []


def _attempt_names(entries: list[str]) -> list[str]:
    """The ``attempt-N`` names among a directory's entries, by N."""
    return sorted((n for n in entries if _ATTEMPT.fullmatch(n)),
                  key=lambda n: int(n.split("-")[1]))


def next_attempt(earlier: list[str]) -> int:
    """The attempt after the runs set aside as ``earlier`` (1 when none): the N of the
    ``attempt-N`` that the next requeue sets this one aside in."""
    return int(earlier[-1].split("-")[1]) + 1 if earlier else 1


def make_private_dir(requested: Path, shared: bool = False, requeue: bool = False) -> Path:
    """Create (or take, when empty) the run directory ``requested`` under the rules above; its
    resolved path, to be used from now on. Raises UnsafeRunDir or StalldocError (exit 125).
    ``shared``: the run directory of a multi-node job, which the watchers of the other nodes
    (the same user) may have made and written their node subdirectories in already.
    ``requeue``: the job runs again; a run already in the directory is set aside in it."""
    target = resolved(requested)
    try:
        parent = _open_parent(target, os.geteuid())
        try:
            _take_final(parent, target, os.geteuid(), shared, requeue)
        finally:
            os.close(parent)
    except OSError as exc:
        raise StalldocError(f"cannot create run directory {target}: {exc.strerror}") from exc
    return target


def resolved(requested: Path) -> Path:
    """``requested`` as an absolute path with the links of its parent followed (``.`` and
    ``..`` at its end: the whole of it); the last name itself is never followed."""
    try:
        if requested.name in ("", ".", ".."):
            target = Path(os.path.realpath(requested))
        else:
            target = Path(os.path.realpath(requested.parent)) / requested.name
    except OSError as exc:
        raise StalldocError(f"cannot resolve run directory {requested}: {exc.strerror}") from exc
    if target == target.parent:
        raise StalldocError(f"cannot use {target} as the run directory")
    return target


def _open_parent(target: Path, uid: int, create: bool = True) -> int:
    """An O_PATH descriptor of ``target``'s parent; each directory from ``/`` on is opened
    without following links, created (0700) where missing (``create=False``: FileNotFoundError
    instead), and checked against the rules."""
    fd = os.open("/", _DIR_FLAGS)
    here = Path("/")
    try:
        _check(fd, here, target, uid)
        for name in target.parent.parts[1:]:
            here = here / name
            below = _open_dir(fd, name, here, target, create)
            os.close(fd)
            fd = below
            _check(fd, here, target, uid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(parent: int, name: str, path: Path, target: Path, create: bool = True) -> int:
    """Open directory ``name`` below ``parent`` (O_PATH, no link followed), made if missing
    and ``create``."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except NotADirectoryError:
        raise _not_a_directory(parent, name, path, target) from None
    try:
        os.mkdir(name, PRIVATE_DIR, dir_fd=parent)
    except FileExistsError:
        pass   # made meanwhile: opened and checked like any other
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError:
        raise _not_a_directory(parent, name, path, target) from None


def _not_a_directory(parent: int, name: str, path: Path, target: Path) -> StalldocError:
    if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
        return UnsafeRunDir(f"unsafe run directory {target}: {path} became a symbolic link "
                            f"after the path was resolved; {_ELSEWHERE}")
    return StalldocError(f"cannot create run directory {target}: {path} is not a directory")


def _check(fd: int, path: Path, target: Path, uid: int) -> None:
    why = unsafe_reason(os.fstat(fd), fd, path, uid)
    if why is not None:
        raise UnsafeRunDir(f"unsafe run directory {target}: {why}")


def _take_final(parent: int, target: Path, uid: int, shared: bool = False,
                requeue: bool = False) -> None:
    """mkdir the run directory (no link followed), or take an existing empty one of ours (any
    of ours when ``shared``; one holding a run when ``requeue``, that run set aside); then make
    it 0700 and check what is there now: a real directory of ours, mode 0700."""
    name = target.name
    try:
        os.mkdir(name, PRIVATE_DIR, dir_fd=parent)
        created = True
    except FileExistsError:
        created = False
    _check_final(os.stat(name, dir_fd=parent, follow_symlinks=False), target, uid)
    taken = not created and not shared and _not_empty(parent, name)
    if taken and not (requeue and _holds_run(parent, name)):
        raise StalldocError(f"run directory is not empty: {target}" + (
            "; it holds no stalldoc run to set aside for this requeue" if requeue else ""))
    os.chmod(name, PRIVATE_DIR, dir_fd=parent)   # a directory of ours, in a parent only we change
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    _check_final(st, target, uid)
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR:
        raise UnsafeRunDir(f"unsafe run directory {target}: its mode stays "
                           f"{stat.S_IMODE(st.st_mode):o} after chmod 700; {_ELSEWHERE}")
    if taken:
        _set_aside(parent, name)


def _check_final(st: os.stat_result, target: Path, uid: int) -> None:
    instead = "give a path that does not exist yet, or an empty directory of yours"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRunDir(f"unsafe run directory {target}: it is a symbolic link; {instead}")
    if not stat.S_ISDIR(st.st_mode):
        raise StalldocError(f"run directory {target} exists and is not a directory")
    if st.st_uid != uid:
        raise UnsafeRunDir(f"unsafe run directory {target}: it exists and is owned by "
                           f"{user_name(st.st_uid)}; {instead}")


def _listing(parent: int, name: str) -> int:
    """The directory ``name`` below ``parent``, opened to list (no link followed)."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=parent)


def _holds_run(parent: int, name: str) -> bool:
    """The directory holds a stalldoc run: its store, a regular file."""
    fd = _listing(parent, name)
    try:
        return stat.S_ISREG(os.stat(DB_NAME, dir_fd=fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def _set_aside(parent: int, name: str) -> None:
    """Move what the directory holds, but earlier attempts, into its next ``attempt-N``."""
    fd = _listing(parent, name)
    try:
        entries = os.listdir(fd)
        aside = f"attempt-{next_attempt(_attempt_names(entries))}"
        os.mkdir(aside, PRIVATE_DIR, dir_fd=fd)
        for entry in entries:
            if not _ATTEMPT.fullmatch(entry):
                os.rename(entry, f"{aside}/{entry}", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _not_empty(parent: int, name: str) -> bool:
    fd = _listing(parent, name)
    try:
        return bool(os.listdir(fd))
    finally:
        os.close(fd)


# ----- the same rules, only read ----------------------------------------------------------------
def refusal(requested: Path) -> str | None:
    """Why ``make_private_dir(requested)`` would refuse, found without making or changing
    anything (``stalldoc doctor``); None when it would not. What does not exist yet would be
    made (0700) and passes."""
    target = resolved(requested)
    try:
        parent = _open_parent(target, os.geteuid(), create=False)
    except FileNotFoundError:
        return None
    except StalldocError as exc:
        return exc.message
    try:
        return _final_refusal(parent, target, os.geteuid())
    finally:
        os.close(parent)


def _final_refusal(parent: int, target: Path, uid: int) -> str | None:
    try:
        st = os.stat(target.name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    try:
        _check_final(st, target, uid)
    except StalldocError as exc:
        return exc.message
    return f"run directory is not empty: {target}" if _not_empty(parent, target.name) else None
