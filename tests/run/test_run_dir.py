"""The run directory policy on real directories: modes, the sticky bit, links, owners (chown
needs root: those tests skip elsewhere), and the bootstrap written inside without following
anything already at its names."""
from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from stalldoc.errors import StalldocError
from stalldoc.run import rundir
from stalldoc.run.inject import BOOTSTRAP, PACKAGE, prepare_bootstrap
from stalldoc.run.options import make_run_dir
from stalldoc.run.rundir import UnsafeRunDir, make_private_dir

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody here")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A directory of ours, 0755, under pytest's (root or us, not writable by others)."""
    tmp_path.chmod(0o755)
    return tmp_path


def directory(path: Path, mode_bits: int) -> Path:
    path.mkdir()
    path.chmod(mode_bits)
    return path


def test_new_run_dir_and_missing_parents_are_0700_whatever_the_umask(base):
    old = os.umask(0o002)
    try:
        made = make_private_dir(base / "a" / "b" / "run")
    finally:
        os.umask(old)
    assert made == base / "a" / "b" / "run"
    assert [mode(p) for p in (base / "a", base / "a" / "b", made)] == [0o700] * 3


def test_default_run_dir_is_under_stalldoc_runs_and_resolved(base, monkeypatch):
    (base / "real").mkdir()
    (base / "here").symlink_to(base / "real")
    monkeypatch.chdir(base / "here")
    made = make_run_dir(None)
    assert made.parent == base / "real" / "stalldoc-runs" and made.is_absolute()
    assert mode(made) == 0o700 and mode(made.parent) == 0o700


def test_world_writable_parent_without_sticky_bit_is_refused_and_nothing_made(base):
    shared = directory(base / "shared", 0o777)
    with pytest.raises(UnsafeRunDir) as refused:
        make_private_dir(shared / "run")
    assert refused.value.exit_code == 125
    assert refused.value.message == (
        f"unsafe run directory {shared / 'run'}: {shared} is writable by every user and has no "
        f"sticky bit, so another user could swap the run directory for one of theirs; chmod o-w "
        f"{shared} (or chmod +t {shared}), or use --run-dir somewhere only you can write")
    assert list(shared.iterdir()) == []


def test_an_unsafe_directory_higher_up_is_refused_too(base):
    shared = directory(base / "shared", 0o777)
    mine = directory(shared / "mine", 0o755)     # ours, but shared can have it renamed away
    with pytest.raises(UnsafeRunDir, match=f": {shared} is writable by every user"):
        make_private_dir(mine / "deeper" / "run")
    assert list(mine.iterdir()) == []


def test_sticky_world_writable_parent_is_accepted(base):
    sticky = directory(base / "sticky", 0o1777)
    made = make_private_dir(sticky / "run")
    assert made == sticky / "run" and mode(made) == 0o700


@needs_root
def test_parent_writable_by_another_group_is_refused(base):
    shared = directory(base / "team", 0o775)
    os.chown(shared, -1, nobody()[1])
    with pytest.raises(UnsafeRunDir, match=r"is writable by group \S+ and has no sticky bit.*"
                                            r"chmod g-w"):
        make_private_dir(shared / "run")
    assert list(shared.iterdir()) == []


def test_parent_writable_by_our_own_private_group_only_is_accepted(base):
    own = directory(base / "own", 0o775)
    fd = os.open(own, os.O_PATH)
    try:
        if not rundir.private_group(os.getegid(), os.geteuid(), fd):
            pytest.skip("our primary group is not a user private group here")
    finally:
        os.close(fd)
    assert mode(make_private_dir(own / "run")) == 0o700


@needs_root
def test_parent_owned_by_another_user_is_refused(base):
    theirs = directory(base / "theirs", 0o755)
    os.chown(theirs, *nobody())
    with pytest.raises(UnsafeRunDir, match=f": {theirs} is owned by nobody, who could swap"):
        make_private_dir(theirs / "run")
    assert list(theirs.iterdir()) == []


def test_link_at_the_path_is_refused_and_its_target_untouched(base):
    target = directory(base / "elsewhere", 0o755)
    (base / "run").symlink_to(target)
    with pytest.raises(UnsafeRunDir, match="it is a symbolic link"):
        make_private_dir(base / "run")
    assert mode(target) == 0o755 and list(target.iterdir()) == []


def test_links_above_are_resolved_once_and_the_real_path_returned(base):
    (base / "real").mkdir()
    (base / "alias").symlink_to(base / "real")
    assert make_private_dir(base / "alias" / "run") == base / "real" / "run"
    assert (base / "real" / "run").is_dir()


def test_a_directory_swapped_for_a_link_after_resolving_is_not_followed(base, monkeypatch):
    # the resolved path names base/alias, which is (now) a link: the walk must not follow it
    target = directory(base / "elsewhere", 0o755)
    (base / "alias").symlink_to(target)
    monkeypatch.setattr(rundir, "resolved", lambda requested: requested)
    with pytest.raises(UnsafeRunDir, match=f": {base / 'alias'} became a symbolic link"):
        make_private_dir(base / "alias" / "run")
    assert list(target.iterdir()) == []


def test_existing_empty_directory_of_ours_is_taken_and_made_0700(base):
    empty = directory(base / "empty", 0o755)
    assert make_private_dir(empty) == empty and mode(empty) == 0o700


def test_non_empty_directory_is_refused_with_its_mode_unchanged(base):
    full = directory(base / "full", 0o755)
    (full / "old").write_text("x")
    with pytest.raises(StalldocError, match=f"run directory is not empty: {full}$"):
        make_private_dir(full)
    assert mode(full) == 0o755


@needs_root
def test_existing_empty_directory_of_another_user_is_refused_untouched(base):
    theirs = directory(base / "theirs", 0o755)
    os.chown(theirs, *nobody())
    with pytest.raises(UnsafeRunDir, match="it exists and is owned by nobody"):
        make_private_dir(theirs)
    assert mode(theirs) == 0o755


def test_a_file_at_the_path_or_above_is_refused(base):
    (base / "file").write_text("x")
    with pytest.raises(StalldocError, match="exists and is not a directory"):
        make_private_dir(base / "file")
    with pytest.raises(StalldocError, match=f"{base / 'file'} is not a directory"):
        make_private_dir(base / "file" / "run")


def test_the_root_directory_is_refused():
    with pytest.raises(StalldocError, match="cannot use / as the run directory"):
        make_private_dir(Path("/"))


def test_dot_is_the_current_directory_resolved(base, monkeypatch):
    empty = directory(base / "empty", 0o755)
    monkeypatch.chdir(empty)
    assert make_private_dir(Path(".")) == empty and mode(empty) == 0o700


# ----- the bootstrap --------------------------------------------------------------------------
def test_bootstrap_replaces_planted_links_and_never_writes_through_them(base):
    run = make_private_dir(base / "run")
    boot = run / "bootstrap"
    boot.mkdir()
    victim = base / "victim.py"
    victim.write_text("precious\n")
    evil = directory(base / "evil", 0o755)
    (boot / "sitecustomize.py").symlink_to(victim)
    (boot / "stalldoc").symlink_to(evil)
    assert prepare_bootstrap(run) == boot
    assert victim.read_text() == "precious\n"
    assert not (boot / "sitecustomize.py").is_symlink()
    assert (boot / "sitecustomize.py").read_bytes() == BOOTSTRAP.read_bytes()
    assert os.readlink(boot / "stalldoc") == str(PACKAGE)
    assert [mode(boot), mode(boot / "sitecustomize.py"), mode(boot / "__pycache__")] == \
        [0o700, 0o600, 0o700]
    assert sorted(p.name for p in boot.iterdir()) == ["__pycache__", "sitecustomize.py",
                                                      "stalldoc"]


def test_bootstrap_that_is_a_link_is_refused(base):
    run = make_private_dir(base / "run")
    evil = directory(base / "evil", 0o755)
    (run / "bootstrap").symlink_to(evil)
    with pytest.raises(StalldocError, match="cannot prepare the agent's bootstrap in .*"
                                            "not a directory of ours"):
        prepare_bootstrap(run)
    assert list(evil.iterdir()) == []


def test_internal_error_log_is_0600_whatever_the_umask(base):
    from stalldoc.errors import log_traceback
    old = os.umask(0o022)
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            assert log_traceback(base / "relay-errors.log") == "RuntimeError: boom"
    finally:
        os.umask(old)
    assert mode(base / "relay-errors.log") == 0o600


# ----- a requeue into the run directory of the run before ---------------------------------------
def test_a_requeue_sets_the_run_there_aside_and_takes_the_directory(base):
    # GIVEN the run directory of a run that ended (its store, its agents' files, a link of the
    # job's own that must move as it is, never followed)
    run = base / "run"
    make_private_dir(run)
    (run / "run.db").write_bytes(b"the first run")
    (run / "agents").mkdir()
    (run / "agents" / "agent-12.state").write_bytes(b"state")
    (run / "latest").symlink_to(base / "elsewhere")
    # WHEN Slurm requeues the job into it, twice
    assert make_private_dir(run, requeue=True) == run
    (run / "run.db").write_bytes(b"the second run")
    make_private_dir(run, requeue=True)
    # THEN each earlier run is whole in its attempt-N, the directory free for the next, 0700
    assert sorted(p.name for p in run.iterdir()) == ["attempt-1", "attempt-2"]
    assert (run / "attempt-1" / "run.db").read_bytes() == b"the first run"
    assert (run / "attempt-1" / "agents" / "agent-12.state").read_bytes() == b"state"
    assert os.readlink(run / "attempt-1" / "latest") == str(base / "elsewhere")
    assert (run / "attempt-2" / "run.db").read_bytes() == b"the second run"
    assert {mode(run), mode(run / "attempt-1"), mode(run / "attempt-2")} == {0o700}
    assert rundir.earlier_attempts(run) == ["attempt-1", "attempt-2"]


def test_a_requeue_into_a_directory_that_holds_no_run_is_refused_untouched(base):
    # a directory of other things (a checkpoint directory given as --run-dir by mistake)
    target = base / "checkpoints"
    target.mkdir(mode=0o750)
    (target / "step-100.pt").write_bytes(b"weights")
    with pytest.raises(StalldocError, match="holds no stalldoc run to set aside"):
        make_private_dir(target, requeue=True)
    assert sorted(p.name for p in target.iterdir()) == ["step-100.pt"]
    assert mode(target) == 0o750


@pytest.mark.parametrize("value,expected", [("1", True), ("3", True), ("0", False), ("", False),
                                            ("x", False), (None, False)])
def test_a_requeue_is_slurms_restart_count(value, expected):
    env = {} if value is None else {"SLURM_RESTART_COUNT": value}
    assert rundir.requeued(env) is expected


def test_the_next_attempt_follows_the_last_set_aside_even_with_one_removed(base):
    # a user removed attempt-1 to free space: the run set aside next is attempt-3, and the
    # relay's count says so too (it once said 3 from the count of two, then named attempt-1)
    run = base / "run"
    make_private_dir(run)
    (run / "attempt-2").mkdir()
    (run / "run.db").write_bytes(b"the second run")
    make_private_dir(run, requeue=True)
    earlier = rundir.earlier_attempts(run)
    assert earlier == ["attempt-2", "attempt-3"] and rundir.next_attempt(earlier) == 4
    assert rundir.next_attempt([]) == 1
