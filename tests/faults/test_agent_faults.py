"""The agent steps aside: the user's sitecustomize keeps its effects, a process that exec'd is
never signalled, wrapped functions look and pickle like the originals, a full disk turns the
agent off instead of killing the job, short-lived processes leave nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from stalldoc.run.inject import agent_environment
from stalldoc.probes import faulthandler_dump
from support import watch, watch_on_tmpfs, why_no_tmpfs


def test_a_user_sitecustomize_keeps_what_it_added_to_sys_path(tmp_path):
    # GIVEN a user's sitecustomize (on PYTHONPATH) that puts a directory of modules on sys.path
    site, extra = tmp_path / "site", tmp_path / "extra"
    site.mkdir()
    extra.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(extra)!r})\n"
                                           "import builtins\nbuiltins.USER_SITE_RAN = True\n")
    (extra / "team_utils.py").write_text("VALUE = 42\n")
    job = [sys.executable, "-c", "import team_utils, builtins, sys, stalldoc.agent.runtime as r; "
           "print('value', team_utils.VALUE, builtins.USER_SITE_RAN, r.current() is not None)"]
    # WHEN the job is watched (the agent's sitecustomize shadows the user's)
    result = watch(tmp_path, job, env={"PYTHONPATH": str(site)})
    # THEN the user's ran, its path entry is kept, and the agent runs too
    assert result.code == 0, result.stderr
    assert "value 42 True True" in result.stdout



@pytest.mark.parametrize("name", ["SIGUSR1", "SIGUSR2"])
def test_a_signal_the_job_leaves_alone_still_ends_it_with_the_agent_in(tmp_path, name):
    # GIVEN a Python job with the agent that handles neither SIGUSR1 nor SIGUSR2 (a scheduler
    # or a user sends them to end a job: Slurm's --signal, submitit, a preemption notice)
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    job = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                            "time.sleep(60)"], env=env, stdout=subprocess.PIPE)
    bare = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        for proc in (job, bare):
            proc.stdout.readline()
        # WHEN someone else sends it the signal
        for proc in (job, bare):
            proc.send_signal(getattr(signal, name))
        # THEN it ends by that signal, as it does without the agent (it once dumped its stacks
        # on SIGUSR2 and ran on)
        assert job.wait(timeout=10) == bare.wait(timeout=10) == -getattr(signal, name)
    finally:
        for proc in (job, bare):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_dump_signal_is_one_nobody_sends_a_job(tmp_path):
    # GIVEN a job with the agent, asked for its faulthandler dump (the ptrace-denied fallback)
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    job = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                            "time.sleep(60)"], env=env, stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        time.sleep(0.5)
        signum = faulthandler_dump.safe_signal(str(tmp_path / "agents"), job.pid)
        # THEN the signal is a real-time one: never SIGUSR1 / SIGUSR2 / SIGQUIT, which
        # schedulers and frameworks use, and the dump still comes
        assert signal.SIGRTMIN <= signum <= signal.SIGRTMAX, signum
        stacks = faulthandler_dump.request(str(tmp_path / "agents"), job.pid)
        assert any(f.function == "<module>" for t in stacks for f in t.frames)
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()

def test_a_process_that_exec_d_into_another_program_is_never_signalled(tmp_path):
    # GIVEN two processes that started the agent: one still Python, one that exec'd into sleep
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    agents = str(tmp_path / "agents")
    python = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                               "time.sleep(60)"], env=env, stdout=subprocess.PIPE)
    execd = subprocess.Popen([sys.executable, "-c", "import os, time; print(1, flush=True); "
                              "os.execv('/bin/sleep', ['sleep', '60'])"], env=env,
                             stdout=subprocess.PIPE)
    try:
        for proc in (python, execd):
            proc.stdout.readline()
        time.sleep(0.5)
        # WHEN the faulthandler fallback asks both for their stacks
        stacks = faulthandler_dump.request(agents, python.pid)
        nothing = faulthandler_dump.request(agents, execd.pid)
        time.sleep(0.5)
        # THEN the Python one answers, the exec'd one is not signalled and lives on
        assert any(f.function == "<module>" for t in stacks for f in t.frames)
        assert nothing == () and execd.poll() is None
    finally:
        for proc in (python, execd):
            proc.kill()
            proc.wait()


def test_wrapped_collectives_keep_their_identity_and_pickle_by_reference(tmp_path):
    pytest.importorskip("torch")
    code = ("import pickle, torch.distributed as d, stalldoc.agent.runtime as r\n"
            "f = d.all_reduce\n"
            "assert getattr(f, '__stalldoc_wrapped__', False), 'not wrapped'\n"
            "assert pickle.loads(pickle.dumps(f)) is f\n"
            "print(f.__module__, f.__qualname__, f.__wrapped__.__qualname__, f.__name__)")
    result = watch(tmp_path, [sys.executable, "-c", code])
    assert result.code == 0, result.stderr
    assert "torch.distributed.distributed_c10d all_reduce all_reduce all_reduce" in result.stdout


def test_short_lived_python_processes_leave_no_state_behind(tmp_path):
    # GIVEN a job that runs 60 short Python processes (a code-execution reward per sample)
    code = ("import subprocess, sys\n"
            "for i in range(60): subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
            "print('samples done', flush=True)")
    result = watch(tmp_path, [sys.executable, "-c", code])
    assert result.code == 0, result.stderr
    # THEN only the job's own process keeps a state file; the others were swept, their start-up
    # cost counted
    left = [n for n in os.listdir(result.run_dir / "agents") if n.startswith("agent-")]
    assert len(left) <= 1, left
    startup = result.report()["run"]["agent_startup"]
    assert startup["processes"] >= 60
    assert 0 < startup["median_ms"] <= startup["max_ms"]


FILL_THEN_RUN = r"""
set -e
dd if=/dev/zero of="$RUN_FS/filler" bs=64k 2>/dev/null || true
for i in 1 2 3; do "$PY" -c "import sys; print('child', sys.argv[1], 'ok')" $i; done
"$PY" -c "import time; [print('beat', i, flush=True) or time.sleep(0.2) for i in range(5)]"
echo all-done
"""


def test_a_full_disk_under_the_run_directory_turns_the_agent_off_not_the_job(tmp_path):
    # GIVEN a run directory on a small tmpfs (a private mount namespace) that the job fills
    why = why_no_tmpfs()
    if why:
        pytest.skip(why)
    proc = watch_on_tmpfs(tmp_path, "2m", FILL_THEN_RUN, "--interval", "0.5")
    # WHEN Python processes start after the disk is full, THEN they all run and print, none dies
    # of SIGBUS, and the job's exit code comes back
    out = proc.stdout
    assert [f"child {i} ok" in out for i in (1, 2, 3)] == [True] * 3, proc.stderr
    assert "beat 4" in out and "all-done" in out
    assert proc.returncode == 0, proc.stderr
    assert "job exited 0" in proc.stderr
