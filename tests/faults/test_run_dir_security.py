"""Hostile input on a shared login node: another user (``nobody``, through setpriv, while we are
root) tries to get the job to run a sitecustomize of theirs through the run directory, and the
run directory keeps everything private while the job's own umask stays untouched.

The attacker's sitecustomize only writes a marker file; no test may ever find it."""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

STALLDOC = [sys.executable, "-m", "stalldoc"]
SETPRIV = shutil.which("setpriv")
PAYLOAD = "open({marker!r}, 'w').write('attacker code ran')\n"


# ----- the other user -------------------------------------------------------------------------
def _nobody() -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def as_nobody(script: str, **popen: object) -> subprocess.Popen[str]:
    uid, gid = _nobody() or (0, 0)
    return subprocess.Popen([str(SETPRIV), f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                             "sh", "-c", script], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **popen)  # type: ignore[arg-type]


def nobody_runs(script: str) -> subprocess.CompletedProcess[str]:
    proc = as_nobody(script)
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory nobody can reach (0755, in /tmp: pytest's own is 0700), with a world-writable
    directory in it that nobody can be shown to write to; skips where that cannot be."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to be a second user with setpriv")
    if SETPRIV is None or _nobody() is None or shutil.which("pgrep") is None:
        pytest.skip("needs setpriv, pgrep and a user nobody")
    path = Path(tempfile.mkdtemp(prefix="stalldoc-two-users-", dir="/tmp"))
    try:
        path.chmod(0o755)
        probe = path / "probe"
        probe.mkdir(mode=0o777)
        probe.chmod(0o777)
        tried = nobody_runs(f"touch {probe}/x && mkdir {probe}/d && mv {probe}/d {probe}/e")
        if tried.returncode != 0:
            pytest.skip(f"nobody cannot write to a 0777 directory here: {tried.stdout.strip()}")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def watch(run_dir: Path | None, job: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    where = ["--run-dir", str(run_dir)] if run_dir is not None else []
    return subprocess.run([*STALLDOC, "watch", *where, "--interval", "0.2", "--", *job],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})


JOB_DELAY = "2.5"   # the job's Python starts this late; its `sleep` tells the attacker when


def python_job(marker: Path, delay: str = JOB_DELAY) -> list[str]:
    """A job whose Python starts late (as a training job's workers do, days later): the window
    in which the attacker swaps the run directory."""
    return ["sh", "-c", f"sleep {delay}; exec {sys.executable} -c \"open('{marker}', 'w')\""]


def plant_evil_dir(where: Path | str, marker: Path) -> str:
    """The attacker's commands that make ``where`` a run directory of theirs, whose bootstrap's
    sitecustomize writes ``marker``."""
    code = PAYLOAD.format(marker=str(marker))
    return (f"mkdir -p {where}/bootstrap && printf '%s' \"{code}\" > "
            f"{where}/bootstrap/sitecustomize.py && chmod -R a+rX {where}")


def swapper(shared: Path, name: str, marker: Path) -> subprocess.Popen[str]:
    """The attacker, running: once the job has started (its `sleep` shows in the process list:
    our bootstrap is written by then), move ``shared/name`` aside and put a link to a directory
    of theirs in its place, with their sitecustomize where the job's Python will look."""
    evil, swapped = shared / "evil", shared / name
    inner = f'"/$(ls {swapped} | head -n 1)"' if name == "stalldoc-runs" else '""'
    script = (f"mkdir {evil} && echo ready; end=$(($(date +%s) + 60)); "
              f"while [ $(date +%s) -lt $end ]; do "
              f"if pgrep -f '^sleep {JOB_DELAY}$' >/dev/null; then inner={inner}; "
              + plant_evil_dir(f'"{evil}$inner"', marker) + " && "
              f"mv {swapped} {shared}/taken.$$ && ln -s {evil} {swapped} && echo swapped; "
              f"break; fi; sleep 0.02; done")
    proc = as_nobody(script)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc: subprocess.Popen[str]) -> str:
    proc.kill()
    out, _ = proc.communicate(timeout=30)
    return out


def refused(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 125, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("stalldoc: unsafe run directory ") and text in line, line


# ----- the tests ------------------------------------------------------------------------------
@pytest.mark.parametrize("default", [False, True], ids=["--run-dir", "default stalldoc-runs"])
def test_parent_writable_by_another_user_without_sticky_bit_is_refused(base, default):
    # GIVEN a directory nobody can write to (no sticky bit), nobody waiting to swap our run
    # directory there for theirs
    shared, job_ran, pwned = base / "shared", base / "job-ran", base / "pwned"
    shared.mkdir()
    shared.chmod(0o777)
    attacker = swapper(shared, "stalldoc-runs" if default else "run", pwned)
    try:
        # WHEN we watch a job there (cwd: shared, whose stalldoc-runs is the default parent)
        result = watch(None if default else shared / "run", python_job(job_ran), cwd=shared)
    finally:
        seen = stop(attacker)
    # THEN no attacker code ran: it was refused before anything started, nothing was swapped
    assert not pwned.exists(), f"the attacker's sitecustomize ran ({seen.split()})"
    assert not job_ran.exists() and "swapped" not in seen
    refused(result, f": {shared} is writable by every user and has no sticky bit")
    assert f"chmod o-w {shared}" in result.stderr
    assert sorted(p.name for p in shared.iterdir()) == ["evil"]


def test_parent_owned_by_another_user_is_refused(base):
    sticky, job_ran = base / "sticky", base / "job-ran"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = sticky / "theirs"
    assert nobody_runs(f"mkdir -m 755 {theirs}").returncode == 0
    result = watch(theirs / "run", python_job(job_ran, "0"), cwd=base)
    refused(result, f": {theirs} is owned by nobody, who could swap the run directory")
    assert not job_ran.exists() and list(theirs.iterdir()) == []


def test_sticky_world_writable_parent_is_accepted_and_the_run_dir_stays_ours(base):
    # GIVEN a directory like /tmp (everyone writes, sticky), nobody trying to swap our run dir
    sticky, job_ran, pwned = base / "sticky", base / "job-ran", base / "pwned"
    sticky.mkdir()
    sticky.chmod(0o1777)
    attacker = swapper(sticky, "run", pwned)
    try:
        # WHEN we watch a job whose Python starts late
        result = watch(sticky / "run", python_job(job_ran), cwd=base)
        intrude = nobody_runs(f"touch {sticky}/run/x || mkdir {sticky}/run/bootstrap/x")
    finally:
        seen = stop(attacker)
    # THEN it runs, with our bootstrap: the sticky bit kept nobody from moving the directory
    assert result.returncode == 0, result.stderr
    assert job_ran.exists() and not pwned.exists()
    assert "swapped" not in seen and not (sticky / "run").is_symlink()
    assert intrude.returncode != 0 and "Permission denied" in intrude.stdout
    assert stat.S_IMODE(os.lstat(sticky / "run").st_mode) == 0o700


@pytest.mark.parametrize("planted", ["link", "empty dir", "dir with bootstrap"])
def test_what_another_user_planted_at_the_path_is_refused(base, planted):
    # GIVEN nobody got to the name first, in a sticky directory: a link to a run directory of
    # theirs, or a directory of theirs (empty, or with a bootstrap already in it)
    sticky, job_ran, pwned = base / "sticky", base / "job-ran", base / "pwned"
    sticky.mkdir()
    sticky.chmod(0o1777)
    run, evil = sticky / "run", sticky / "evil"
    plant = {"link": plant_evil_dir(evil, pwned) + f" && ln -s {evil} {run}",
             "empty dir": f"mkdir -m 755 {run}",
             "dir with bootstrap": plant_evil_dir(run, pwned)}[planted]
    assert nobody_runs(plant).returncode == 0
    before = {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in sticky.rglob("*")}
    # WHEN we watch a Python job there
    result = watch(run, python_job(job_ran, "0"), cwd=base)
    # THEN nothing of theirs ran, it was refused, and nothing of theirs was changed
    assert not pwned.exists() and not job_ran.exists()
    refused(result, "it is a symbolic link" if planted == "link"
            else "it exists and is owned by nobody")
    assert {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in sticky.rglob("*")} == before


# ----- modes, without a second user -----------------------------------------------------------
ENGINE = textwrap.dedent("""
    class EngineArgs:
        gpu_memory_utilization = 0.5
        def create_engine_config(self):
            return "config"
""")
JOB = textwrap.dedent("""
    import os, subprocess, sys, time
    from vllm.engine.arg_utils import EngineArgs    # stand-in: hooks-<pid>.txt, vllm-<pid>.json
    EngineArgs().create_engine_config()
    # a process whose agent cannot make its state file: agent-errors.log
    subprocess.run(["sh", "-c", 'mkdir -m 700 "$STALLDOC_AGENT_DIR/agent-$$.state"; '
                    f'exec {sys.executable} -c pass'], check=True)
    umask = os.umask(0)
    os.umask(umask)
    with open(sys.argv[1], "w") as fh:               # the job's own file, under its own umask
        fh.write(f"{umask:o}")
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
""")
EXPECTED = ["run.db", "sidecar.log", "agent-errors.log", "agents/hooks-*.txt",
            "agents/vllm-*.json", "agents/faulthandler-*.txt", "agents/agent-*.state",
            "bootstrap/sitecustomize.py", "bootstrap/__pycache__/sitecustomize.*.pyc"]


def loose_modes(run_dir: Path) -> list[str]:
    """What in the run directory another user could read or write (links: not followed)."""
    loose = []
    for path in [run_dir, *run_dir.rglob("*")]:
        st = os.lstat(path)
        bits = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode) and bits != 0o700 or \
                not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) and bits & 0o077:
            loose.append(f"{bits:o} {path.relative_to(run_dir)}")
    return loose


def test_every_file_of_the_run_is_private_and_the_jobs_umask_is_untouched(tmp_path):
    # GIVEN a job that makes the agent write every kind of file it writes, under umask 022,
    # with bytecode writing on (the job's interpreter caches our sitecustomize)
    lib = tmp_path / "lib" / "vllm" / "engine"
    lib.mkdir(parents=True)
    for init in (lib.parent / "__init__.py", lib / "__init__.py"):
        init.write_text("")
    (lib / "arg_utils.py").write_text(ENGINE)
    (tmp_path / "job.py").write_text(JOB)
    own, go, run = tmp_path / "own-file", tmp_path / "go", tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(tmp_path / "lib")])
    # WHEN it is watched
    proc = subprocess.Popen([*STALLDOC, "watch", "--run-dir", str(run), "--interval", "0.2",
                             "--", sys.executable, str(tmp_path / "job.py"), str(own), str(go)],
                            env=env, umask=0o022, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while not (own.exists() and (run / "run.db-wal").exists()) and time.time() < deadline:
            time.sleep(0.1)
        running = loose_modes(run)
        present = {pattern: bool(list(run.glob(pattern)))
                   for pattern in [*EXPECTED, "run.db-wal", "run.db-shm"]}
        go.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    # THEN everything in the run directory is ours only, while it runs and after; the job's
    # own file has the job's mode
    assert proc.returncode == 0, out
    assert all(present.values()), present
    assert running == [] and loose_modes(run) == []
    assert own.read_text() == "22" and stat.S_IMODE(own.stat().st_mode) == 0o644
