"""stalldoc watch against real torchrun (gloo) jobs: the culprit rank and frame are named."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys

import pytest

from load import cpu_burner
from support import SCENARIOS, alarms, launcher, torchrun, watch
from test_launcher_ranks import job_pid

pytestmark = pytest.mark.timeout(180) if hasattr(pytest.mark, "timeout") else []


@pytest.mark.parametrize("nproc,stuck_rank,func,op", [
    (3, 1, "fetch_batch", "all_reduce"),
    (2, 0, "read_shard_from_nfs", "all_gather"),
    (4, 3, "score_with_reward_server", "broadcast"),
])
def test_stuck_rank_is_named_with_its_frame(run_watch, nproc, stuck_rank, func, op):
    # GIVEN a job where one rank never returns from a user function while the others wait in OP
    env = {"STUCK_RANK": str(stuck_rank), "STUCK_FUNC": func, "OP": op}
    # WHEN it is watched with --on-stall kill
    result = run_watch(torchrun(nproc, "collective_wait.py"), "--on-stall", "kill", env=env)
    # THEN the stall is diagnosed, the job ended with the documented code, and the culprit named
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [stuck_rank]
    assert finding["evidence"]["op"] == op
    assert sorted(finding["evidence"]["waiting_ranks"]) == sorted(
        set(range(nproc)) - {stuck_rank})
    assert finding["evidence"]["frame"].startswith(f"{func} (")
    assert any(frame.startswith(f"{func} (") for frame in finding["evidence"]["frames"])
    assert result.findings("SD104") == []  # waiting on an Event is not a lock deadlock
    assert f"rank {stuck_rank} not in {op}" in finding["summary"]
    assert (finding["trigger"], finding["stall_id"], finding["resolved_at"]) == ("stall", 1, None)
    meta = result.meta()   # who ended the job, and watch's own code beside the job's
    assert (meta["on_stall"], meta["ended_by"], meta["watch_exit_code"]) == ("kill", "stalldoc",
                                                                            "124")
    report = result.report()
    assert len(report["stalls"]) == 1
    stall = report["stalls"][0]
    assert stall["detected_at"] - stall["started_at"] >= 3
    assert {s["rank"] for s in report["stacks"]} == set(range(nproc))


@pytest.mark.parametrize("name,nproc,stuck_rank", [("accelerate", 2, 1), ("deepspeed", 3, 0)])
def test_other_launchers_are_seen_through(run_watch, name, nproc, stuck_rank):
    # GIVEN the same hang started by `accelerate launch` (torchrun inside the launcher's own
    # process) or by `deepspeed` (runner -> deepspeed.launcher.launch -> ranks with --local_rank)
    env = {"STUCK_RANK": str(stuck_rank), "STUCK_FUNC": f"wait_for_{name}_batch"}
    result = run_watch(launcher(name, nproc, "collective_wait.py"), "--on-stall", "kill", env=env)
    # THEN the ranks are found below the launcher and the stuck one is named with its frame
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [stuck_rank]
    assert finding["evidence"]["frame"].startswith(f"wait_for_{name}_batch (")
    report = result.report()
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(nproc))
    script = str(SCENARIOS / "collective_wait.py")
    extra = {"accelerate": [], "deepspeed": ["--local_rank={}"]}[name]
    for rank in report["ranks"]:  # the ranks themselves, not the launcher processes above them
        assert rank["cmdline"][1:] == ["-u", script, *(a.format(rank["local_rank"]) for a in extra)]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_ptrace_denied_falls_back_to_faulthandler_and_says_how_to_fix(tmp_path):
    # GIVEN a watcher without CAP_SYS_PTRACE (dropped from its bounding set) and a stuck rank
    # that made itself non-dumpable: py-spy is refused, as in a container without the capability
    env = {"STUCK_RANK": "1", "STUCK_FUNC": "poll_rollout_queue", "REFUSE_TRACING": "1"}
    result = watch(tmp_path, torchrun(2, "collective_wait.py"), "--on-stall", "kill", env=env,
                   prefix=["setpriv", "--bounding-set", "-sys_ptrace"])
    assert result.code == 124, result.stderr
    # THEN the stuck rank's frame still comes out, from the agent's faulthandler dump
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [1]
    assert finding["evidence"]["frame"].startswith("poll_rollout_queue (")
    stacks = {s["rank"]: s for s in result.report()["stacks"]}
    assert stacks[1]["method"] == "faulthandler"
    # AND the user is told why and how to fix it, live and in the report
    assert "Permission denied" in stacks[1]["error"] and "CAP_SYS_PTRACE" in stacks[1]["error"]
    assert "from the fallback: py-spy was denied" in result.stderr
    text = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(result.run_dir)],
                          capture_output=True, text=True, check=True).stdout
    assert "rank 1: faulthandler; py-spy was denied" in text


def test_lock_deadlock_names_both_threads(run_watch):
    result = run_watch(torchrun(2, "lock_deadlock.py"), "--on-stall", "kill",
                       env={"DEADLOCK_RANK": "1"})
    assert result.code == 124, result.stderr
    [deadlock] = result.findings("SD104")
    assert deadlock["ranks"] == [1]
    assert deadlock["evidence"]["frame"].startswith("update_cache (")
    [other] = deadlock["evidence"]["blocked_threads"]
    assert other["thread"] == "cache-writer"
    assert other["frame"].startswith("helper (")
    [outside] = result.findings("SD101")
    assert outside["ranks"] == [1]


def test_sigkilled_rank_is_blamed_with_signal_and_memory(run_watch):
    env = {"SIGNAL": "KILL", "SIGNAL_RANK": "2", "GROW_MB": "300"}
    result = run_watch(torchrun(3, "rank_signal.py"), env=env)
    assert result.code != 0
    [dead] = result.findings("SD103")
    assert dead["ranks"] == [2]
    assert (dead["trigger"], dead["stall_id"]) == ("exit", None)
    assert {f["trigger"] for f in result.report()["findings"]} <= {"exit", "tick"}
    meta = result.meta()
    assert (meta["on_stall"], meta["ended_by"]) == ("observe", "job")
    assert meta["watch_exit_code"] == str(result.code)
    assert dead["evidence"]["signal"] == 9
    assert "SIGKILL" in dead["summary"]
    assert "OOM" in dead["fix"]
    first, last = dead["evidence"]["rss_bytes_first_last"]
    assert last - first > 200 * 2**20


def test_stopped_rank_is_named(run_watch):
    env = {"SIGNAL": "STOP", "SIGNAL_RANK": "0"}
    result = run_watch(torchrun(2, "rank_signal.py"), "--on-stall", "kill", env=env)
    assert result.code == 124, result.stderr
    [stopped] = result.findings("SD105")
    assert stopped["ranks"] == [0]
    assert "kill -CONT" in stopped["fix"]
    stacks = {s["rank"]: s for s in result.report()["stacks"]}
    assert stacks[0]["method"] == "py-spy-nonblocking"


def test_healthy_long_phase_stays_quiet(run_watch):
    # a compute phase of 8 s with a 3 s stall timeout: busy CPU with a moving stack is progress
    result = run_watch(torchrun(2, "healthy_busy.py"), env={"BUSY_SECONDS": "8"})
    assert result.code == 0, result.stderr
    report = result.report()
    assert report["stalls"] == []
    assert alarms(report) == []
    assert report["phases"]["evaluate"]["count"] == 2
    assert report["phases"]["evaluate"]["median"] >= 8
    # the telemetry of a real run: memory peaks per rank and per phase, probes timed, no GPU here
    peaks = report["watermarks"]["run"]
    assert [p["rank"] for p in peaks] == [0, 1] and all(p["peak_rss_bytes"] > 0 for p in peaks)
    assert {p["phase"] for p in report["watermarks"]["phases"]} >= {"step/evaluate"}
    busy = [r["cpu_percent"] for r in report["timeseries"]["ranks"]
            if r["phase"] == "step/evaluate" and r["cpu_percent"] is not None]
    assert max(busy) > 25   # the evaluate phase burns a core (a share of one under load)
    probes = {p["probe"]: p for p in report["probes"]}
    assert probes["host"]["runs"] > 5 and probes["agent"]["failures"] == 0
    assert probes["nvml"]["available"] or probes["nvml"]["unavailable"]  # on, or says why not
    assert report["host"]["cores"] >= 1 and report["host"]["min_available_bytes"] > 0


@pytest.mark.parametrize("func", ["await_reply", "wait_for_rollout"])
def test_single_process_job(run_watch, func):
    result = run_watch([sys.executable, str(SCENARIOS / "single_wait.py")], "--on-stall", "kill",
                       env={"WAIT_FUNC": func})
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD106")
    assert finding["ranks"] == [0]
    assert finding["evidence"]["frame"].startswith(f"{func} (")


HELPER_JOB = [sys.executable, str(SCENARIOS / "single_with_helper.py"), "--deepspeed",
              "ds_zero3.json"]


@pytest.mark.parametrize("func", ["wait_for_scores", "collect_rewards"])
def test_a_single_process_job_is_its_own_rank_never_the_helper_it_started(run_watch, func):
    # GIVEN `python score_rollouts.py --deepspeed ds_zero3.json`, no RANK anywhere: it starts a
    # detached Python helper (a local scoring server) that never answers, and waits for it
    result = run_watch(HELPER_JOB, "--on-stall", "kill", env={"WAIT_FUNC": func})
    # THEN the stall is named in the job's own frame: its process is rank 0 from start to end,
    # said once, and said to be a single process that claims no rank
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD106")
    assert finding["ranks"] == [0]
    assert finding["evidence"]["frame"].startswith(f"{func} ("), finding["evidence"]
    job = job_pid(result)
    assert [(r["rank"], r["pid"]) for r in result.report()["ranks"]] == [(0, job)]
    assert re.findall(r"rank 0: pid (\d+)(.*)", result.stderr) == [
        (str(job), " (a single process: it claims no rank)")], result.stderr


@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])   # healthy: under load
def test_a_single_process_waiting_on_its_working_helper_is_not_stalled(run_watch, loaded):
    # GIVEN the same job, its helper computing for 8 s (past the 3 s stall timeout) while the
    # job waits for its answer, watched with the kill action armed
    with cpu_burner(2 if loaded else 0):
        result = run_watch(HELPER_JOB, "--on-stall", "kill", env={"HELPER_SECONDS": "8"})
    # THEN the helper's work is the job's: it runs to its end, no stall
    assert result.code == 0, result.stderr
    assert "helper said: scores" in result.stdout
    assert result.report()["stalls"] == [], result.stderr


def test_log_signatures_are_reported_once_and_counted(run_watch, tmp_path):
    result = run_watch([sys.executable, str(SCENARIOS / "log_errors.py")], env={"REPEAT": "4"})
    assert result.code == 0, result.stderr
    findings = result.report()["findings"]
    oom = [f for f in findings if f["code"] == "SD506"]
    server = [f for f in findings if f["code"] == "SD507"]
    assert len(oom) == 1 and len(server) == 1          # one finding each, not one per line
    assert oom[0]["trigger"] == "tick" and oom[0]["resolved_at"] is None
    assert oom[0]["occurrences"] >= 2 and oom[0]["updated_at"] > oom[0]["t"]
    assert oom[0]["evidence"]["requested"] == "1.50 GiB" and oom[0]["ranks"] == [0, 1]
    assert server[0]["evidence"]["waited_seconds"] == "240.0"
    assert result.stderr.count("[SD506 error]") == 1  # printed when opened, not on every repeat
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)


@pytest.mark.parametrize("nproc,wait_rank,executor", [(2, 0, False), (3, 2, True)],
                         ids=["main-thread", "executor-thread"])
def test_rank_waiting_on_a_silent_server_is_named_with_the_server(run_watch, nproc, wait_rank,
                                                                 executor):
    # GIVEN a reward server (here: this test) that accepts connections and never answers, asked
    # from the rank's main thread, or from an executor's thread while the main thread waits on
    # its future (swift 3.x's rollout client)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        env = {"WAIT_RANK": str(wait_rank), "REWARD_PORT": str(port),
               "IN_EXECUTOR": "1" if executor else "0"}
        result = run_watch(torchrun(nproc, "reward_server_wait.py"), "--on-stall", "kill",
                           env=env)
    assert result.code == 124, result.stderr
    # THEN the rank is named as waiting on that server, from the call in the user's code
    [finding] = result.findings("SD107")
    assert finding["ranks"] == [wait_rank]
    assert finding["evidence"]["peers"] == [f"127.0.0.1:{port}"]
    assert finding["evidence"]["frame"].startswith("score_with_reward_model (")
    assert f"waits for a server's reply from 127.0.0.1:{port}" in finding["summary"]
    if executor:   # the thread that waits, and that its main thread waits on it
        assert finding["evidence"]["thread"].startswith("ThreadPoolExecutor"), finding
        assert "which its main thread waits on" in finding["summary"], finding["summary"]
    else:
        assert "thread" not in finding["evidence"], finding
    [outside] = result.findings("SD101")          # and it is the one the others wait for
    assert outside["ranks"] == [wait_rank]


@pytest.mark.parametrize("nproc,stuck_rank,func,source", [
    (3, 2, "score_completions", "flight_recorder"),
    (4, 0, "load_reference_shard", "agent"),
])
def test_a_watchdog_timeout_is_matched_with_the_rings(tmp_path, nproc, stuck_rank, func, source):
    # GIVEN a ZeRO-3-like job whose waiting ranks' (stand-in) NCCL watchdog prints its timeout,
    # numbered by the process group's own sequence, long after stalldoc saw the stall; with the
    # Flight Recorder (exact: SeqNum is its collective_seq_id) or with the agent's rings only
    env = {"STUCK_RANK": str(stuck_rank), "STUCK_FUNC": func, "WATCHDOG_S": "15"}
    options = () if source == "flight_recorder" else ("--no-flight-recorder",)
    result = watch(tmp_path, torchrun(nproc, "zero3_watchdog.py"), *options, env=env)
    # THEN the watchdog finding says which collective timed out, who never entered it and where
    # that rank is, and keeps the first line it saw
    [finding] = result.findings("SD501")
    ring = finding["evidence"]["ring"]
    waiting = sorted(set(range(nproc)) - {stuck_rank})
    assert ring["missing_ranks"] == [stuck_rank], result.stderr
    assert ring["source"] == source and ring["op_agrees"]
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)
    # gloo's recorder names the gather all_gather; the agent, the call the job made
    assert ring["op"] == {"agent": "all_gather_into_tensor", "flight_recorder": "all_gather"}[source]
    if source == "flight_recorder":
        assert str(ring["seq"]) == finding["evidence"]["seq"]
    assert set(ring["waiting_ranks"]) <= set(waiting) and ring["waiting_ranks"]
    culprit = ring["culprits"][str(stuck_rank)]
    assert culprit["frame"].startswith(f"{func} (")
    assert f"never entered #{ring['seq']}; rank {stuck_rank} is in {func} (" in finding["summary"]
    first = finding["evidence"]["lines"][0]
    assert f"SeqNum={finding['evidence']['seq']}," in first and "Watchdog caught" in first
    # AND the stall came first, with the same culprit
    [sd101] = result.findings("SD101")
    assert sd101["ranks"] == [stuck_rank]


# vLLM prints this at the end of a script that finished well (vllm-project/vllm#28838, #32468)
ENGINE_GONE = ("ERROR 01-16 17:16:49 [core_client.py:605] Engine core proc EngineCore_DP0 died "
               "unexpectedly, shutting down client.")
FATAL = "ERROR 04-28 02:37:03 [core.py:398] EngineCore encountered a fatal error."


@pytest.mark.parametrize("lines,code,resolved", [
    ([ENGINE_GONE], 0, True),             # the engine's shutdown at a clean exit: not a failure
    ([ENGINE_GONE], 1, False),            # the same line, and the job failed: it stays
    ([FATAL, ENGINE_GONE], 0, False),     # a fatal error is one whatever the exit code
])
def test_a_line_printed_at_a_clean_shutdown_is_resolved(tmp_path, lines, code, resolved):
    # GIVEN a job whose last act is printing vLLM's engine-core lines, then exiting at once
    script = ("import sys, time\nprint('Processed prompts: 100%', flush=True)\ntime.sleep(1.5)\n"
              + "".join(f"print({line!r}, file=sys.stderr, flush=True)\n" for line in lines)
              + f"sys.exit({code})\n")
    result = watch(tmp_path, [sys.executable, "-c", script])
    assert result.code == code, result.stderr
    # THEN the lines printed just before the end are still read (the watcher's last look), and
    # the finding is resolved only when it is nothing but the engine's shutdown of a clean run
    [finding] = result.findings("SD520")
    assert finding["evidence"]["count"] == len(lines)
    assert (finding["resolved_at"] is not None) == resolved
    assert ("SD520 printed as the job shut down; it exited 0" in result.stderr) == resolved
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)


def test_ranks_a_wrapper_keeps_the_agent_out_of_are_said_and_still_judged(tmp_path):
    # GIVEN torchrun starting each rank through the team's wrapper, which sets its own
    # PYTHONPATH (so stalldoc's bootstrap is gone from it), and rank 1 stuck outside the
    # collective rank 0 waits in
    wrapper = tmp_path / "run_rank.sh"
    wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH="{tmp_path / "src"}"\n'
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    command = torchrun(2, "collective_wait.py")
    command[command.index("--master_port") + 2:command.index("--master_port") + 2] = [
        "--no-python", str(wrapper)]
    result = watch(tmp_path, command, "--on-stall", "kill")
    # THEN both ranks are said to run without the agent, with why
    [agentless] = result.findings("SD118")
    assert agentless["ranks"] == [0, 1], agentless
    assert "its PYTHONPATH does not hold stalldoc's bootstrap" in agentless["summary"]
    assert "collectives and their rings" in agentless["evidence"]["missing"], agentless
    # AND the stall is still declared and its culprit named, from py-spy's stacks
    assert result.code == 124, result.stderr[-3000:]
    [culprit] = result.findings("SD101")
    assert culprit["ranks"] == [1] and "(seen from stacks)" in culprit["summary"], culprit


def test_a_one_process_job_in_isolated_mode_is_said_and_runs_on(tmp_path):
    # GIVEN a labelling script run with python -I (no agent), logging a line per batch
    script = str(SCENARIOS / "judge_labelling.py")
    result = watch(tmp_path, [sys.executable, "-I", script, "8"], "--on-stall", "kill")
    # THEN it runs to its end, and the one finding says it ran without the agent, and why
    assert result.code == 0, result.stderr[-3000:]
    [agentless] = result.report()["findings"]
    assert agentless["code"] == "SD118" and agentless["summary"].startswith(
        "rank 0 (pid "), agentless
    assert "runs without stalldoc's agent: python -I: isolated mode" in agentless["summary"]


@pytest.mark.parametrize("where", ["deepspeed-chat/train.py", "torchrun_tools/train_accelerate.py"])
def test_a_one_process_script_named_after_launchers_is_its_own_rank(tmp_path, where):
    # GIVEN a one-process labelling script in a folder or under a name that holds launchers'
    # and frameworks' words (users name them after the tools they use), hung on its own lock
    script = tmp_path / "code" / where
    script.parent.mkdir(parents=True)
    shutil.copy(SCENARIOS / "judge_labelling.py", script)
    result = watch(tmp_path, [sys.executable, str(script), "100", "4"], "--on-stall", "kill")
    # THEN its process is rank 0, and its hang is named at the script's own frame
    assert result.code == 124, result.stderr[-3000:]
    assert [(r["rank"], r["pid"]) for r in result.report()["ranks"]] == [(0, job_pid(result))]
    [finding] = result.findings("SD104")
    assert f"Quota.refill ({script}:" in finding["summary"], finding["summary"]
