"""WAL on local disks, a rollback journal where the run directory is on a network filesystem.
The mountinfo lines are in the kernel's format (proc(5)), with the mount options real NFS,
Lustre and GPFS clients show."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from stalldoc.report.build import build_report
from stalldoc.store.db import RunStore
from stalldoc.store.journal import choose_journal, filesystem_of, mount_types

MOUNTINFO = r"""
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
26 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
88 22 0:47 / /mnt/shared rw,relatime shared:45 - nfs4 10.0.0.5:/export/home rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.21,local_lock=none,addr=10.0.0.5
89 88 253:2 / /mnt/shared/local\040scratch rw,relatime shared:46 - xfs /dev/vdb rw,attr2,inode64
120 22 0:52 / /lustre/scratch rw,relatime shared:60 - lustre 10.1.0.1@o2ib:/scratch rw,flock,lazystatfs,encrypt
121 22 0:53 / /gpfs/projects rw,relatime shared:61 - gpfs projects rw
"""


def test_mountinfo_is_read_with_its_escapes():
    types = mount_types(MOUNTINFO)
    assert types["/mnt/shared"] == "nfs4"
    assert types["/mnt/shared/local scratch"] == "xfs"
    assert types["/"] == "ext4"


def test_the_longest_mount_point_holding_the_path_wins():
    assert filesystem_of(Path("/mnt/shared/alice/stalldoc-runs/x"), MOUNTINFO) == "nfs4"
    assert filesystem_of(Path("/mnt/shared/local scratch/runs"), MOUNTINFO) == "xfs"
    assert filesystem_of(Path("/mnt/sharedother"), MOUNTINFO) == "ext4"
    assert filesystem_of(Path("/lustre/scratch"), MOUNTINFO) == "lustre"


def test_network_filesystems_get_a_rollback_journal():
    for path in ("/mnt/shared/runs", "/lustre/scratch/u/runs", "/gpfs/projects/runs"):
        choice = choose_journal(Path(path), MOUNTINFO)
        assert (choice.mode, choice.synchronous) == ("delete", "FULL")
        assert choice.filesystem in choice.reason and "network" in choice.reason
    local = choose_journal(Path("/home/alice/runs"), MOUNTINFO)
    assert (local.mode, local.synchronous, local.reason) == ("wal", "NORMAL", "")


def test_the_store_uses_the_journal_chosen_and_says_so(tmp_path):
    (tmp_path / "nfs").mkdir()
    store = RunStore(tmp_path / "nfs", journal=choose_journal(Path("/mnt/shared/r"), MOUNTINFO))
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2       # FULL
    store.start_run("r", ["train.py"], "node", 1.0, 45, True)
    store.close()
    assert build_report(tmp_path / "nfs")["run"]["journal_mode"] == "delete"
    local = RunStore(tmp_path)   # this machine's tmp: a local filesystem
    assert local.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert local.conn.execute("PRAGMA synchronous").fetchone()[0] == 1       # NORMAL
    local.close()
    meta = dict(sqlite3.connect(tmp_path / "run.db").execute("SELECT key, value FROM meta"))
    assert meta["journal_mode"] == "wal" and meta["filesystem"]
