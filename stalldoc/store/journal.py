"""Which SQLite journal the run database may use where it lies.

WAL needs shared memory between the processes that open the database, which a network
filesystem (NFS, Lustre, GPFS, BeeGFS, CephFS, SMB, ...) does not give: SQLite's documentation
says WAL "does not work over a network filesystem". Run directories often sit on one on clusters,
so there the database uses a rollback journal (``DELETE``, synchronous FULL); on local disks WAL
with synchronous NORMAL, which is crash-safe for the database in WAL mode.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "fuse.cephfs",
    "glusterfs", "fuse.glusterfs", "9p", "fuse.sshfs", "sshfs", "afs", "panfs", "wekafs",
    "orangefs", "pvfs2", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    "fuse.lizardfs", "fuse.mfs", "fuse.moosefs", "fuse.ossfs", "fuse.goofys", "davfs",
    "fuse.davfs2", "ncpfs", "coda", "fuse.blobfuse", "fuse.blobfuse2", "quobyte", "fuse.quobyte",
})
MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class JournalChoice:
    mode: str          # "wal" or "delete"
    synchronous: str   # "NORMAL" or "FULL"
    filesystem: str    # the mount's type, "" when unknown
    reason: str        # one line for the user, when not WAL

    @property
    def pragmas(self) -> tuple[str, ...]:
        return (f"PRAGMA journal_mode={self.mode}", f"PRAGMA synchronous={self.synchronous}")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def mount_types(mountinfo: str) -> dict[str, str]:
    """Mount point -> filesystem type, from the text of /proc/PID/mountinfo (the later mount of
    a point wins, as it hides the earlier one)."""
    out: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and tail:
            out[_unescape(fields[4])] = tail[0]
    return out


def filesystem_of(path: Path, mountinfo: str) -> str:
    """The type of the filesystem holding ``path`` (resolved): its longest mount point prefix."""
    target = os.path.realpath(path)
    best, kind = "", ""
    for point, fstype in mount_types(mountinfo).items():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def choose_journal(run_dir: Path, mountinfo: str | None = None) -> JournalChoice:
    """WAL on a local filesystem, a rollback journal on a network one."""
    if mountinfo is None:
        try:
            mountinfo = Path(MOUNTINFO).read_text(encoding="utf-8", errors="replace")
        except OSError:
            mountinfo = ""
    fstype = filesystem_of(run_dir, mountinfo)
    if fstype in NETWORK_FILESYSTEMS:
        return JournalChoice("delete", "FULL", fstype,
                             f"run directory on {fstype} (a network filesystem): the run database "
                             "uses a rollback journal, WAL is unsafe there")
    return JournalChoice("wal", "NORMAL", fstype, "")
