"""The build locks of torch C++ extensions, read from real directories and real processes: the
root from a process's environment as torch derives it, each lock's age, and the processes
working in its directory: its builders while ninja is one of them (a copy of sleep named ninja
stands in for it), else the leftovers of a stopped build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from stalldoc.probes.build_locks import build_locks, extension_root

SLEEP = [sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"]


def started(env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
    """A process with this environment, once it runs (its environment is its own only after
    the exec)."""
    proc = subprocess.Popen(SLEEP, env=env, cwd=cwd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def named(name: str, tmp_path: Path, cwd: Path) -> subprocess.Popen:
    """A real process whose command name is ``name`` (a copy of sleep), working in ``cwd``, once
    it runs under that name."""
    program = tmp_path / "bin" / name
    program.parent.mkdir(exist_ok=True)
    if not program.exists():
        shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    proc = subprocess.Popen([str(program), "60"], cwd=cwd)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != name:
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.01)
    return proc


def test_the_root_is_torchs_own_choice(tmp_path: Path):
    procs = [started({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "HOME": "/home/me"}),
             started({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/home/me",
                      "HF_TOKEN": "hf_secret"}),
             started({"HOME": "/home/me"}), started({})]
    try:
        roots = [extension_root(p.pid) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert roots == [str(tmp_path / "ext"), str(tmp_path / "xdg" / "torch_extensions"),
                     "/home/me/.cache/torch_extensions", None]
    assert extension_root(procs[0].pid) is None   # gone: unreadable


def test_locks_with_their_age_and_the_processes_building(tmp_path: Path):
    # GIVEN the default root's layout (an accelerator directory, then one per extension): a
    # lock written 10 minutes ago that nobody builds, and one whose directory ninja works in
    root = tmp_path / ".cache" / "torch_extensions" / "py311_cpu"
    stale, busy, done = root / "deepspeed_shm_comm", root / "fused_adam", root / "cpu_adam"
    for directory in (stale, busy, done):
        directory.mkdir(parents=True)
    (stale / "lock").write_text("")
    (busy / "lock").write_text("")
    (done / "cpu_adam.so").write_text("")          # built: no lock
    os.utime(stale / "lock", (time.time() - 600, time.time() - 600))
    rank = started({"HOME": str(tmp_path)})
    ninja, compiler = named("ninja", tmp_path, busy), started({}, cwd=busy)
    try:
        locks = build_locks([rank.pid])
    finally:
        for p in (rank, ninja, compiler):
            p.kill()
            p.wait()
    assert [lock.path for lock in locks] == [str(stale / "lock"), str(busy / "lock")]
    assert 599 <= locks[0].age <= 610 and locks[0].builders == locks[0].leftovers == ()
    assert locks[1].age < 30 and locks[1].builders == tuple(sorted((ninja.pid, compiler.pid)))
    assert locks[1].leftovers == ()


def test_compilers_with_no_ninja_are_the_leftovers_of_a_stopped_build(tmp_path: Path):
    # GIVEN a lock whose build's torch and ninja were killed, its two compilers still running
    # (ninja starts them in process groups of their own)
    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "lock").write_text("")
    rank = started({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    compilers = [named("cc1plus", tmp_path, tmp_path / "fused_adam") for _ in range(2)]
    try:
        [lock] = build_locks([rank.pid])
    finally:
        for p in (rank, *compilers):
            p.kill()
            p.wait()
    assert lock.builders == ()
    assert lock.leftovers == tuple(sorted(p.pid for p in compilers))


def test_a_root_given_by_torch_extensions_dir_has_no_accelerator_level(tmp_path: Path):
    (tmp_path / "my_op").mkdir()
    (tmp_path / "my_op" / "lock").write_text("")
    rank = started({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    try:
        [lock] = build_locks([rank.pid, rank.pid])
    finally:
        rank.kill()
        rank.wait()
    assert lock.path == str(tmp_path / "my_op" / "lock")


def test_no_lock_or_no_readable_process_finds_nothing(tmp_path: Path):
    rank = started({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    try:
        assert build_locks([rank.pid]) == ()
    finally:
        rank.kill()
        rank.wait()
    assert build_locks([rank.pid]) == ()
