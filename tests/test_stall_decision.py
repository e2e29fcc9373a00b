"""A working rank is slow, not stuck: real torchrun (gloo) jobs with honest long phases are
never called stalled, and real hangs are still named with their rank and frame in time.

Each healthy phase lasts longer than the stall timeout (3 s here) and looks like the slow parts
of real jobs: compute that sits on one source line, a C extension call, one rank writing a
checkpoint to slow storage while the others wait in a barrier, evaluation reading slow storage,
preprocessing in worker processes (a pool, ``datasets.map(num_proc=2)``, DataLoader workers),
loading shards from slow storage. "Slow storage" is a FIFO served at a few MB/s by a process
outside the job, so the rank blocks in read / write with little CPU, as on a busy NFS. The
healthy phases run one after another in one job, as a long job meets its slow parts, with both
cores saturated by other processes (the harder footing: an idle machine's run of the same job,
3 ranks, was dropped for the suite's time), and each phase's test reads the findings opened
while it ran; each hang runs once, half of them on an idle machine and half under that load.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from load import cpu_burner, silent_server, slow_reader, slow_writer, starved
from support import (STALL_TIMEOUT, Result, end_watched, start_watch, torchrun, wait_for_line,
                     watch, why_no_schedstat)

pytestmark = pytest.mark.timeout(240) if hasattr(pytest.mark, "timeout") else []

MB = 1 << 20
RATE = 3 * MB            # slow storage: 3 MB/s
PHASE_MB = 24            # about 8 s of slow storage
KINDS = ["matmul_loop", "checkpoint_one_rank", "long_forward", "pool_preprocess",
         "evaluation_one_rank", "c_extension_call", "datasets_map", "slow_storage_load",
         "dataloader_workers"]   # one job runs them in this order, 2 training steps between
ONE_RANK = {"checkpoint_one_rank", "evaluation_one_rank"}   # the others wait for rank 0
SLOW_KINDS = ("checkpoint_one_rank", "evaluation_one_rank", "slow_storage_load")


@contextlib.contextmanager
def storage(kind: str, nproc: int, path: str) -> Iterator[None]:
    """The slow storage a kind reads or writes at ``path``, served by processes outside the job."""
    with contextlib.ExitStack() as stack:
        if kind == "checkpoint_one_rank":
            stack.enter_context(slow_reader(path, RATE))
        elif kind == "evaluation_one_rank":
            stack.enter_context(slow_writer(path, PHASE_MB * MB, RATE))
        elif kind == "slow_storage_load":
            for rank in range(nproc):
                stack.enter_context(slow_writer(f"{path}.{rank}", PHASE_MB * MB, RATE))
        yield


def load(loaded: bool) -> contextlib.AbstractContextManager:
    return cpu_burner(2) if loaded else contextlib.nullcontext()


@dataclass(frozen=True)
class PhasesRun:
    """One watched job that ran every healthy phase in turn, and where each phase lay in time."""
    result: Result
    windows: dict[str, tuple[float, float]]   # kind -> (first rank started, last rank done)

    def findings_in(self, kind: str) -> list[dict]:
        """The stall, exit and progress findings opened while phase ``kind`` ran."""
        first, last = self.windows[kind]
        return [f for f in self.result.report()["findings"]
                if f["severity"] != "info" and (f["code"].startswith("SD1")
                                                or f["trigger"] in ("stall", "exit"))
                and first <= f["t"] <= last + 1.0]


def phase_windows(stdout: str) -> dict[str, tuple[float, float]]:
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    for kind, what, at in re.findall(r"\] (\w+): (started|done in [\d.]+ s) at ([\d.]+)", stdout):
        (starts if what == "started" else ends).setdefault(kind, []).append(float(at))
    return {kind: (min(starts[kind]), max(ends[kind])) for kind in starts if kind in ends}


@pytest.fixture(scope="module", params=[(True, 2)], ids=["loaded"])
def healthy_phases(request, tmp_path_factory) -> PhasesRun:
    """Every healthy kind in one real torchrun job of 2 ranks with both cores saturated, each
    phase 7 s, as a long job goes through its slow parts one by one."""
    loaded, nproc = request.param
    tmp = tmp_path_factory.mktemp("healthy_loaded" if loaded else "healthy_idle")
    paths = {f"SLOW_PATH_{kind.upper()}": str(tmp / kind) for kind in SLOW_KINDS}
    env = {"PHASE": ",".join(KINDS), "PHASE_SECONDS": "7", "PHASE_MB": str(PHASE_MB), **paths}
    with contextlib.ExitStack() as stack:
        for kind in SLOW_KINDS:
            stack.enter_context(storage(kind, nproc, str(tmp / kind)))
        stack.enter_context(load(loaded))
        result = watch(tmp, torchrun(nproc, "healthy_phases.py"), "--on-stall", "kill",
                       env=env, timeout=400)
    return PhasesRun(result, phase_windows(result.stdout))


@pytest.mark.timeout(480)
def test_healthy_phases_job_runs_to_its_end_without_a_stall(healthy_phases):
    """About 85 s (the module's one job, which every phase's test reads): nine healthy phases
    of 7 s each, each over twice the stall timeout, one after another, both cores busy."""
    # THEN the job ran to its end, untouched, and no stall was declared
    result = healthy_phases.result
    assert result.code == 0, result.stderr
    assert result.report()["stalls"] == [], result.report()["stalls"]
    assert sorted(healthy_phases.windows) == sorted(KINDS), result.stdout


@pytest.mark.timeout(480)
@pytest.mark.parametrize("kind", KINDS)
def test_healthy_long_phase_is_never_a_stall(healthy_phases, kind):
    result = healthy_phases.result
    phase = re.search(rf"{kind}: done in ([\d.]+) s", result.stdout)
    assert phase and float(phase.group(1)) > 2 * float(STALL_TIMEOUT), result.stdout
    # stall, exit and progress findings (SD1xx) while it ran; the machine-load ones (SD302 on a
    # loaded machine) say true things about the machine, not about the job being stuck.
    # A rank that works on while others wait is slow, not hung: SD108, resolved when it is done
    # (ranks doing the same phase finish at different times, most of all on a loaded machine)
    findings = [(f["code"], f["ranks"], f["summary"], f["resolved_at"])
                for f in healthy_phases.findings_in(kind)]
    assert all(code == "SD108" and resolved for code, _, _, resolved in findings), findings
    if kind in ONE_RANK:   # the others wait for rank 0: said once
        assert len(findings) == 1, findings
        [(_, ranks, summary, _)] = findings
        assert ranks == [0] and "reading / writing" in summary, findings


def test_a_slow_rank_is_resolved_when_its_phase_ends_right_before_the_job_exits(run_watch,
                                                                               tmp_path):
    # rank 0 writes its checkpoint to slow storage while rank 1 waits, then both leave at once:
    # ticks 5 s apart, so the phase's end and the exit fall between two ticks almost always
    env = {"PHASE": "checkpoint_one_rank", "PHASE_SECONDS": "7", "STEPS_AFTER": "0",
           "SLOW_PATH": str(tmp_path / "slow")}
    with storage("checkpoint_one_rank", 2, env["SLOW_PATH"]):
        result = run_watch(torchrun(2, "healthy_phases.py"), "--interval", "5", env=env,
                           timeout=200)
    assert result.code == 0, result.stderr
    [slow] = result.findings("SD108")
    assert slow["ranks"] == [0] and slow["state"] == "resolved", slow
    assert slow["resolved_at"] >= slow["updated_at"]


HANGS = [  # load, kind, ranks, stuck rank, function: each kind once, both loads among them
    (False, "queue_get", 3, 2, "next_prefetched_batch"),
    (True, "lock", 2, 0, "refresh_vocab_cache"),
    (True, "sleep_poll", 4, 3, "wait_for_rollout_ready"),
    (False, "socket_read", 2, 1, "request_reward_score"),
    (False, "checkpoint_open", 3, 0, "save_checkpoint"),
]
# what the stuck rank's main thread is blocked in, as the culprit's words say it (a lock, a queue
# or a sleep is the Python stack's to say: no system call named)
BLOCKED_IN = {"socket_read": "recvfrom(TCP to 127.0.0.1:{port})",
              "checkpoint_open": "openat({path})"}


@pytest.mark.parametrize("loaded,kind,nproc,stuck,func", HANGS,
                         ids=[f"{'loaded' if h[0] else 'idle'}-{h[1]}" for h in HANGS])
def test_true_hang_is_named_with_rank_and_frame_in_time(run_watch, tmp_path, kind, nproc, stuck,
                                                        func, loaded):
    path = tmp_path / "ckpt" / "step_2.pt"   # a mount that no longer answers: a FIFO nobody reads
    path.parent.mkdir()
    os.mkfifo(path)
    env = {"HANG": kind, "HANG_RANK": str(stuck), "HANG_FUNC": func, "CHECKPOINT_PATH": str(path)}
    with silent_server() as port, load(loaded):
        result = run_watch(torchrun(nproc, "hang_kinds.py"), "--on-stall", "kill",
                           env={**env, "SERVER_PORT": str(port)}, timeout=200)
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [stuck]
    assert finding["evidence"]["frame"].startswith(f"{func} ("), finding["evidence"]
    # AND where the rank waits on a socket or a file, the system call it is blocked in, on what
    kernel = finding["evidence"].get("kernel_wait")
    if kind in BLOCKED_IN:
        said = "blocked in " + BLOCKED_IN[kind].format(port=port, path=path)
        assert kernel is not None and said in finding["summary"], finding
    else:
        assert kernel is None and "blocked in " not in finding["summary"], finding
    assert sorted(finding["evidence"]["waiting_ranks"]) == sorted(set(range(nproc)) - {stuck})
    # named within the stall timeout + 5 s of the moment the rank entered the hang
    entered = float(re.search(r"hang starts at ([\d.]+)", result.stdout).group(1))
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - entered <= float(STALL_TIMEOUT) + 5, (stall, entered)
    # AND the stall says what each rank was seen doing: nothing
    assert {int(r) for r in stall["work"]} == set(range(nproc))
    assert all(w["verdict"] == "idle" for w in stall["work"].values()), stall["work"]


@pytest.mark.parametrize("nproc", [3])   # two ranks exit early beside rank 0 (with 2: one)
def test_ranks_that_exit_zero_early_are_not_failures(run_watch, nproc):
    # GIVEN ranks 1.. finish and exit 0 while rank 0 evaluates alone for longer than the timeout
    result = run_watch(torchrun(nproc, "uneven_finish.py"), "--on-stall", "kill",
                       env={"EVAL_SECONDS": "8"})
    # THEN the job is untouched, nothing is a stall, no exit is a finding above info
    assert result.code == 0, result.stderr
    report = result.report()
    assert report["stalls"] == []
    assert [f for f in report["findings"] if f["code"] == "SD103"] == []
    assert {r["rank"]: r["exit_code"] for r in report["ranks"]} == {r: 0 for r in range(nproc)}


def test_spinning_rank_is_slow_then_a_possible_livelock_never_a_stall(tmp_path):
    # GIVEN rank 1 spinning on a flag nobody will set while rank 0 waits in all_reduce
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
           "--stall-timeout", STALL_TIMEOUT, "--busy-timeout", "8", "--interval", "0.5",
           "--kill-grace", "3", "--on-stall", "kill", "--", *torchrun(2, "spin_on_flag.py")]
    watcher = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = []
    try:
        for line in watcher.stderr:           # WHEN it is watched until SD109 is printed
            seen.append(line)
            if "[SD109 warning]" in line:
                watcher.send_signal(signal.SIGTERM)
                break
        _, rest = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    stderr = "".join(seen) + rest
    # THEN no stall (the rank is busy in a working frame) and the job was not killed for one
    assert "STALL" not in stderr and watcher.returncode != 124, stderr
    report = Result(0, stderr, run_dir).report()
    assert report["stalls"] == []
    [slow] = [f for f in report["findings"] if f["code"] == "SD108"]
    assert slow["ranks"] == [1] and "wait in all_reduce" in slow["summary"]
    [spin] = [f for f in report["findings"] if f["code"] == "SD109"]
    assert spin["ranks"] == [1] and spin["severity"] == "warning"
    assert spin["evidence"]["frame"].startswith("wait_until_tokenizer_ready (")


@pytest.mark.parametrize("nproc,stuck", [(3, 1), (2, 0)])
def test_everyone_waits_for_a_rank_that_left_early(run_watch, nproc, stuck):
    # GIVEN a rank that ran out of data and exited 0 while its forked worker keeps its sockets
    # open, so the others hang in all_reduce (as under NCCL) instead of failing
    env = {"HANG": "rank_exits_with_child", "HANG_RANK": str(stuck), "LINGER_SECONDS": "40"}
    result = run_watch(torchrun(nproc, "hang_kinds.py"), "--on-stall", "kill", env=env)
    assert result.code == 124, result.stderr
    # THEN the rank that left is named, with its exit, and the worker it left is not a rank
    [finding] = result.findings("SD110")
    assert finding["ranks"] == [stuck]
    assert sorted(finding["evidence"]["waiting_ranks"]) == sorted(set(range(nproc)) - {stuck})
    # the exit status is read from the zombie before torchrun reaps it; under heavy load torchrun
    # may win that race, and then the status is unknown (never made up)
    left = finding["evidence"]["exits"][str(stuck)]
    assert left["exit_code"] == 0 or (left["exit_code"] is None and left["source"] == "unknown"), left
    assert sorted(r["rank"] for r in result.report()["ranks"]) == list(range(nproc))


def test_busy_background_thread_does_not_hide_the_hang(run_watch):
    # GIVEN rank 1 stuck on a silent server, rank 0 waiting in all_reduce, and on every rank a
    # metrics thread always on the CPU, in changing functions (the rank is busy, a thread works)
    env = {"HANG": "socket_read", "HANG_RANK": "1", "HANG_FUNC": "request_reward_score",
           "BUSY_THREAD": "1"}
    with silent_server() as port:
        result = run_watch(torchrun(2, "hang_kinds.py"), "--on-stall", "kill",
                           env={**env, "SERVER_PORT": str(port)}, timeout=200)
    # THEN the main threads decide: the hang is named in time, the ranks seen spinning in a wait
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [1]
    assert finding["evidence"]["frame"].startswith("request_reward_score ("), finding["evidence"]
    entered = float(re.search(r"hang starts at ([\d.]+)", result.stdout).group(1))
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - entered <= float(STALL_TIMEOUT) + 5, (stall, entered)
    assert all(w["verdict"] == "idle" for w in stall["work"].values()), stall["work"]


@pytest.mark.parametrize("loaded", [True], ids=["loaded"])   # work on a loaded machine
def test_a_phase_entered_on_its_own_thread_is_the_ranks_work(run_watch, loaded):
    # GIVEN ranks whose rollout computes 8 s (over twice the stall timeout) on a generation
    # thread that entered the phase `rollout` there, while each main thread waits on a socket
    # for the samples (no marker moves meanwhile)
    with load(loaded):
        result = run_watch(torchrun(2, "rollout_thread.py"), "--on-stall", "kill",
                           env={"ROLLOUT_SECONDS": "8"}, timeout=200)
    # THEN the phase's thread decides with the main thread: the ranks work, no stall
    assert result.code == 0, result.stderr
    assert result.stdout.count("mean reward") == 2, result.stdout
    assert result.report()["stalls"] == []


def test_the_same_thread_without_its_phase_does_not_hide_the_wait(run_watch):
    # GIVEN the same ranks, the generation thread not marking its phase: a busy background
    # thread while the main thread waits on a socket, which is not the rank's work
    result = run_watch(torchrun(2, "rollout_thread.py"), "--on-stall", "kill",
                       env={"ROLLOUT_SECONDS": "60", "PHASED": "0"}, timeout=200)
    # THEN a stall, the ranks seen waiting on the socket in the main thread's frame
    assert result.code == 124, result.stderr
    [stall] = result.report()["stalls"]
    assert all(w["stack_kind"] == "waiting: socket" for w in stall["work"].values()), stall
    assert all(w["frame"].startswith("wait_for_rollout (") for w in stall["work"].values())


# ----- an oversubscribed node: runnable ranks that wait for a CPU ------------------------------
def job_root(relay: int) -> int:
    """The job the relay started (its child that is not the sidecar)."""
    import psutil
    [job] = [c for c in psutil.Process(relay).children()
             if "stalldoc.sidecar" not in " ".join(c.cmdline())]
    return job.pid


def watch_starved(tmp_path: Path, script: str, nproc: int, env: dict[str, str],
                  starts: str, spinners: int = 16) -> Result:
    """Watch ``script`` (kill armed); once a line of its output contains ``starts``, squeeze the
    job onto one CPU shared with ``spinners`` spinning processes until it ends."""
    proc = start_watch(tmp_path / "run", torchrun(nproc, script), "--on-stall", "kill", env=env)
    seen: list[str] = []
    try:
        wait_for_line(proc.stdout, starts, seen)
        with starved(job_root(proc.pid), spinners):
            out, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return Result(proc.returncode, err, tmp_path / "run", "".join(seen) + out)


def starved_samples(run_dir: Path) -> dict[int, int]:
    """Per rank, how many samples saw it and its descendants use under 10% of a core together
    (what a rank doing nothing uses)."""
    from stalldoc.store.reader import open_reader
    with open_reader(run_dir) as conn:
        rows = conn.execute("SELECT rank, COUNT(*) FROM samples WHERE cpu_percent"
                            " + COALESCE(children_cpu_percent, 0) < 10 GROUP BY rank").fetchall()
    return dict(rows)


@pytest.mark.skipif(bool(why_no_schedstat()), reason=why_no_schedstat())
@pytest.mark.alone
@pytest.mark.parametrize("kind,nproc", [("long_forward", 3)])   # a matmul loop starves alike
def test_ranks_starved_of_cpu_mid_phase_are_slow_never_stalled(tmp_path, kind, nproc):
    # GIVEN a healthy job whose node is oversubscribed from the start of its long phase on: its
    # ranks share one core with 16 other processes, so each gets a few % of a core, in working
    # code (an evaluation's matmuls, a deep forward pass), and no marker moves for 10 s
    env = {"PHASE": kind, "PHASE_SECONDS": "10"}
    result = watch_starved(tmp_path, "healthy_phases.py", nproc, env, f"{kind}: started")
    # THEN the job ran to its end untouched: no stall, nothing killed
    assert result.code == 0, result.stderr
    assert result.report()["stalls"] == [], result.stderr
    assert re.search(rf"{kind}: done in", result.stdout), result.stdout
    # AND the ranks really were below the CPU a busy rank shows, for longer than the timeout
    # (0.5 s ticks): what they used alone would have called them idle
    low = starved_samples(result.run_dir)
    assert sorted(low) == list(range(nproc)) and all(n * 0.5 > 2 * float(STALL_TIMEOUT)
                                         for n in low.values()), low


@pytest.mark.alone
def test_a_hang_in_a_starved_job_is_still_named(tmp_path):
    # GIVEN rank 2 of 3 polling for a flag file nobody creates (it wakes 5 times a second and
    # queues for the CPU each time) while the others wait in all_reduce, on the same
    # oversubscribed core
    env = {"HANG": "sleep_poll", "HANG_RANK": "2", "HANG_FUNC": "wait_for_rollout_ready"}
    result = watch_starved(tmp_path, "hang_kinds.py", 3, env, "hang starts at")
    # THEN it is a stall all the same, with the stuck rank and its frame
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [2], finding["summary"]
    assert finding["evidence"]["frame"].startswith("wait_for_rollout_ready ("), finding["evidence"]
    entered = float(re.search(r"hang starts at ([\d.]+)", result.stdout).group(1))
    [stall] = result.report()["stalls"]
    assert stall["detected_at"] - entered <= float(STALL_TIMEOUT) + 10, (stall, entered)


# ----- a one-process job without torch, whose only sign of work is its own step lines -------
JUDGE = str(Path(__file__).parent / "scenarios" / "judge_labelling.py")


@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])   # healthy: under load
def test_a_one_process_script_whose_step_lines_advance_is_never_a_stall(tmp_path, loaded):
    # GIVEN a labelling script that waits for its judge API's quota before each batch (asleep,
    # no CPU, no torch: no agent marker), logging each batch, watched with the kill armed
    with cpu_burner(2 if loaded else 0):
        result = watch(tmp_path, [sys.executable, JUDGE, "16"], "--on-stall", "kill",
                       timeout=120)
    # THEN its batch lines are its progress: it runs to its end (it was once killed at 3 s)
    assert result.code == 0, result.stderr[-3000:]
    assert "batch 15/16:" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [] and [f["summary"] for f in report["findings"]] == []


def test_a_one_process_script_that_deadlocks_after_its_steps_is_named_at_the_lock(tmp_path):
    # GIVEN the same script, whose quota refill after 6 batches takes the lock it holds
    result = watch(tmp_path, [sys.executable, JUDGE, "100", "6"], "--on-stall", "kill",
                   timeout=120)
    # THEN its step lines stop, and the stall is declared and named at the lock
    assert result.code == 124, result.stderr[-3000:]
    assert "batch 4/100:" in result.stdout and "batch 5/100:" not in result.stdout
    [stall] = result.report()["stalls"]
    [finding] = result.findings("SD104")
    assert finding["ranks"] == [0], finding
    assert re.search(r"waits on a lock at Quota\.refill \(\S+/judge_labelling\.py:\d+\)",
                     finding["summary"]), finding["summary"]


# under load: the same deadlock without its health lines is named on an idle machine above
@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])
def test_a_hung_script_that_says_it_is_alive_is_still_a_stall(tmp_path, loaded):
    # GIVEN the deadlocking script with its health lines on: a metrics endpoint scraped twice a
    # second (each request in its access log), a heartbeat line a second with the elapsed time
    # and the last batch, an INFO line of the quota; all on side threads, going on after the hang
    with cpu_burner(2 if loaded else 0):
        result = watch(tmp_path, [sys.executable, JUDGE, "100", "6"], "--on-stall", "kill",
                       env={"HEALTH": "1"}, timeout=120)
    # THEN those lines kept nothing alive: the stall is declared and named at the lock
    assert result.code == 124, result.stderr[-3000:]
    assert '"GET /metrics HTTP/1.1" 200' in result.stderr   # the access log went on
    beats = re.findall(r"heartbeat: alive, elapsed (\S+), last batch 4/100", result.stdout)
    assert len(beats) >= 2, result.stdout[-2000:]            # and the heartbeat, after the hang
    [stall] = result.report()["stalls"]
    [finding] = result.findings("SD104")
    assert finding["ranks"] == [0], finding
    # AND none of them is a finding, nor quoted by one
    report = result.report()
    assert [f["code"] for f in report["findings"]] == ["SD104"], report["findings"]
    quoted = json.dumps(report["findings"])
    assert "heartbeat" not in quoted and "GET /metrics" not in quoted, quoted


def test_a_stall_holds_while_nothing_works_past_the_agents_own_reads(tmp_path: Path) -> None:
    # GIVEN a dataset preparation script with no torch whose main thread deadlocks on a lock a
    # worker kept, in its first seconds; watched in observe mode (the default: no kill)
    script = str(Path(__file__).parent / "scenarios" / "prep_lock_deadlock.py")
    watcher = start_watch(tmp_path / "run", [sys.executable, script])
    try:
        assert watcher.stdout is not None
        wait_for_line(watcher.stdout, "hang begins", [])
        # WHEN the hang lasts past the agent's own publishing of the versions (10 s after its
        # start, for a process that never imports torch)
        time.sleep(14)
    finally:
        stdout, stderr = end_watched(watcher)
    # THEN one stall, never said to have resumed: the agent's reads are not the job's work
    assert stderr.count("STALL #") == 1 and "progress resumed" not in stderr, stderr[-3000:]
    [stall] = Result(watcher.returncode, stderr, tmp_path / "run", stdout).report()["stalls"]
    assert stall["ended_at"] is None, stall
    assert "SD104" in stderr and "prep_lock_deadlock.py:" in stderr, stderr[-3000:]
