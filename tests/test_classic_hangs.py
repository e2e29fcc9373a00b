"""The classic DDP hangs named for what they are, from real reproducers (each scenario cites its
sources): real torchrun gloo jobs under watch, the finding's cause (``evidence.cause``) and its
fix, in the JSON, text, markdown and HTML reports; and no cause claimed where the evidence does
not decide one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import torchrun

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("nproc,records,after,ahead", [
    (2, 9, "barrier", [0]),                 # rank 0: 5 batches, rank 1: 4
    (3, 10, "all_gather_object", [0]),      # 4, 3, 3
    (3, 11, "barrier", [0, 1]),             # 4, 4, 3: two ranks ahead
])
def test_uneven_inputs_are_named_as_ranks_that_ran_different_numbers_of_steps(
        run_watch, nproc, records, after, ahead):
    # GIVEN DDP over a sharded dataset whose records do not split evenly over the ranks
    result = run_watch(torchrun(nproc, "sharded_uneven.py"), "--on-stall", "kill",
                       env={"RECORDS": str(records), "AFTER": after}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the ranks with a batch more are named, waiting in DDP's gradient all-reduce from
    # backward() where the others wait in the collective after their loop
    [finding] = result.findings("SD101")
    assert finding["ranks"] == ahead, finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "uneven_steps", cause
    behind = min(set(range(nproc)) - set(ahead))
    assert cause["ops"] == {str(ahead[0]): "all_reduce",
                            str(behind): "barrier" if after == "barrier" else "all_gather"}
    assert cause["frames"][str(ahead[0])].startswith("train (") and \
        "sharded_uneven.py" in cause["frames"][str(ahead[0])], cause
    assert cause["frames"][str(behind)].startswith("main ("), cause
    assert "different numbers of steps (uneven inputs)" in finding["summary"]
    assert "drop_last" in finding["fix"] and "join()" in finding["fix"]
    # AND every report a person reads says it
    for fmt in ("text", "markdown", "html"):
        said = result.rendered(fmt).replace("\\", "")
        assert "different numbers of steps" in said and "drop_last" in said, fmt


@pytest.mark.parametrize("nproc,skipper,variant,said", [
    (3, 1, "oom", "| WARNING: ran out of memory, skipping this batch."),      # pytorch#44353
    (2, 0, "anchors", "rank 0: skipping micro-batch 2: NoValidAnchorsError"),  # Automodel#2468
])
def test_a_rank_that_skipped_a_batch_after_an_exception_is_named_as_a_skipped_step(
        run_watch, nproc, skipper, variant, said):
    # GIVEN DDP where one rank catches an exception in its step and skips that batch alone,
    # then all ranks meet in a barrier after the loop
    result = run_watch(torchrun(nproc, "skip_on_exception.py"), "--on-stall", "kill",
                       env={"SKIP_RANK": str(skipper), "VARIANT": variant}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the others wait in their last gradient all-reduce from backward() while the skipper
    # waits in the barrier, and the cause quotes the log's skip and says to skip together
    [finding] = result.findings("SD101")
    others = sorted(set(range(nproc)) - {skipper})
    assert finding["ranks"] == others, finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "skipped_step", cause
    assert cause["log_line"].startswith(said), cause
    assert cause["ops"] == {str(others[0]): "all_reduce", str(skipper): "barrier"}, cause
    assert cause["frames"][str(others[0])].startswith("train ("), cause
    assert "batch skipped after an error" in finding["summary"]
    assert "ReduceOp.MAX" in finding["fix"] and "drop_last" not in finding["fix"]
    for fmt in ("text", "markdown"):
        assert "batch skipped after an error" in result.rendered(fmt).replace("\\", ""), fmt


# DeepSpeed builds its CPU shared-memory op on first use into ~/.cache/torch_extensions, behind
# a file lock: a second ZeRO-3 job started meanwhile (another xdist worker) has every rank asleep
# on that lock, which is a stall as far as that job can show. The ZeRO-3 jobs run one at a time,
# after the build (``deepspeed_ops``), which may take far longer than a job.
ONE_DEEPSPEED_BUILD = [pytest.mark.xdist_group("deepspeed_ops"), pytest.mark.timeout(1200)]


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """DeepSpeed's CPU shared-memory op (``build_shm_op``, which ``deepspeed.init_distributed``
    loads), built once before the ZeRO-3 jobs: a C++ build of about 110 CPU-seconds (60 s on an
    idle 2-core machine, over 200 s beside the suite's other workers) on a fresh machine, which
    a job's own timeout is not for. A build ended mid-way (a job killed at its timeout) leaves
    its lock behind, and every later ZeRO-3 job asleep on it for good."""
    pytest.importorskip("deepspeed")
    subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op\n"
                    "assert build_shm_op() is not None"], check=True, capture_output=True,
                   timeout=1100, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("nproc,sharding,mode,named,kind", [
    (4, "fsdp", "lengths", [3], "forward_count_differs"),    # DeepSpeed#8262, ParlAI#3753
    pytest.param(3, "zero3", "lengths", [2], "forward_count_differs",   # OpenTau#462
                 marks=ONE_DEEPSPEED_BUILD),
    (2, "fsdp", "rank0", [0], "forward_on_some_ranks"),      # pytorch#101294: rank 0 alone
    pytest.param(3, "zero3", "rank0", [0], "forward_on_some_ranks",     # DeepSpeed#5539
                 marks=ONE_DEEPSPEED_BUILD),
])
def test_a_forward_not_every_rank_runs_under_sharding_is_named_with_its_frames(
        run_watch, request, nproc, sharding, mode, named, kind):
    if sharding == "zero3":
        request.getfixturevalue("deepspeed_ops")
    # GIVEN FSDP2 (fully_shard) or DeepSpeed ZeRO-3 ranks that generate from prompts of
    # different lengths without synced_gpus, or rank 0 generating a sample alone, while the
    # others reach a barrier
    result = run_watch(torchrun(nproc, "sharded_generate.py"), "--on-stall", "kill",
                       env={"MODE": mode, "SHARDING": sharding}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the finding names the rank(s) apart, and the cause says a forward under FSDP gathers
    # parameters from every rank: where the forward came from, and the fix for that cause
    [finding] = result.findings("SD102")
    assert finding["ranks"] == named, finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == kind, cause
    assert cause["sharding"] == {"fsdp": "FSDP", "zero3": "ZeRO-3"}[sharding], cause
    assert any(f.startswith("generate (") and "sharded_generate.py" in f
               for f in cause["forward_frames"]), cause
    if kind == "forward_on_some_ranks":
        assert cause["forward_rank"] == 0 and "never ran" in finding["summary"]
        assert "summon_full_params" in finding["fix"] and "generate (" in finding["fix"]
    else:
        assert cause["forward_rank"] != named[0] and "synced_gpus=True" in finding["fix"]


@pytest.mark.parametrize("nproc,images", [(3, 10)])   # 4, 3, 3: one rank a prediction ahead
def test_predictions_of_different_lengths_all_gathered_are_a_reported_mismatch(
        run_watch, nproc, images, tmp_path):
    # GIVEN evaluation that all-gathers each rank's predictions, one more on the first rank(s)
    # (pytorch/ignite#1569): gloo checks the sizes and aborts the rank that received more
    result = run_watch(torchrun(nproc, "gather_predictions.py"), env={"IMAGES": str(images)},
                       timeout=200)
    assert result.code != 0, result.stderr
    # THEN the mismatch gloo reported is a finding with its sizes, beside the aborted rank
    [mismatch] = result.findings("SD529")
    assert int(mismatch["evidence"]["received"]) > int(mismatch["evidence"]["expected"])
    assert "collective mismatch" in mismatch["evidence"]["lines"][0]
    # AND the job's log, saved and read back by `stalldoc logs`, gives what was said live
    result.read_back(tmp_path)
    assert "pad" in mismatch["fix"]
    [dead] = result.findings("SD103")
    assert "SIGABRT" in dead["summary"], dead["summary"]
    # and the aborted rank's fix is the mismatch's, not a native crash's, with the line quoted
    assert "native crash" not in dead["fix"] and "same shape" in dead["fix"], dead["fix"]
    assert "collective mismatch" in dead["evidence"]["mismatch_line"]


@pytest.mark.parametrize("nproc,sees", [(2, "0"), (4, "0,1")])
def test_a_collective_on_a_branch_some_ranks_take_is_named_with_the_branch(
        run_watch, tmp_path, nproc, sees):
    # GIVEN a resume from a checkpoint that only the ranks in SEES see (KempnerForge#49): they
    # broadcast it in load(), the others skip the branch and start training
    result = run_watch(torchrun(nproc, "resume_seen_by_some.py"), "--on-stall", "kill",
                       env={"SEES": sees, "CKPT_DIR": str(tmp_path / "ckpt")}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the ranks that skipped it are missing from the broadcast, and the cause names the
    # branch: the broadcast's frames in load(), on a rank that sees the file
    seeing = [int(r) for r in sees.split(",")]
    [finding] = result.findings("SD101")
    assert finding["ranks"] == sorted(set(range(nproc)) - set(seeing)), finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "some_ranks_only", cause
    assert cause["branch_rank"] in seeing
    assert cause["branch_frames"][0].startswith("load (") and \
        cause["branch_frames"][1].startswith("main ("), cause
    assert "only some ranks take" in finding["summary"] and "uneven" not in finding["summary"]
    assert "load (" in finding["fix"] and "every rank" in finding["fix"]


@pytest.mark.parametrize("nproc", [4])   # two TP groups; ranks 1-3 in the world's gather
def test_ranks_waiting_for_each_other_in_two_groups_are_one_finding_naming_both(run_watch, nproc):
    # GIVEN a colocated TP engine per pair of ranks (trl#3671); at step 2 rank 0 skips its
    # weight sync (the world's gather) and enters generate (its TP group's all-reduce)
    result = run_watch(torchrun(nproc, "colocated_lora_order.py"), "--on-stall", "kill",
                       timeout=200)
    assert result.code == 124, result.stderr
    # THEN one finding names ranks 0 and 1, each waiting for the other in another group
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [0, 1], finding["summary"]
    assert finding["summary"].startswith(
        f"ranks 0,1 wait for each other in two groups' collectives: ranks 1-{nproc - 1} wait "
        "in all_reduce #"), finding["summary"]
    assert "(group world) that rank 0 never entered; rank 0 waits in all_reduce #" in \
        finding["summary"] and "that rank 1 never entered; rank 0 is in Engine.generate (" in \
        finding["summary"] and "rank 1 is in sync_weights (" in finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "crossed_groups", cause
    assert [g["group"] for g in cause["groups"]][0] == "world", cause
    assert finding["evidence"]["crossed"]["missing_ranks"] == [1], finding["evidence"]
    assert "in the same order" in finding["fix"]


@pytest.mark.parametrize("nproc", [3])   # rank 0 in its branch, two ranks in all_reduce
def test_a_barrier_on_rank_zero_only_is_named_with_the_branch_it_sits_in(run_watch, nproc):
    # GIVEN rank 0 waiting on a barrier inside its save branch while the others all-reduce
    result = run_watch(torchrun(nproc, "rank_zero_save.py"), "--on-stall", "kill", timeout=200)
    assert result.code == 124, result.stderr
    # THEN SD102 names rank 0, and the cause: its barrier was issued from save_checkpoint, a
    # line no other rank issued a collective from, while the others' all_reduce in
    # average_gradients is one rank 0 made every step (the dumps hold the frames: importing
    # torch.optim brings in what torch records them with)
    [finding] = result.findings("SD102")
    assert finding["ranks"] == [0], finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "some_ranks_only", cause
    assert cause["ops"] == {"0": "barrier", "1": "all_reduce"}
    assert cause["branch_rank"] == 0
    assert [f.split(" (")[0] for f in cause["branch_frames"]] == ["save_checkpoint", "main",
                                                                  "<module>"]
    assert cause["frames"]["1"].startswith("average_gradients (")
    assert "only some ranks take" in finding["summary"] and "uneven" not in finding["summary"]
    assert "save_checkpoint (" in finding["fix"]


@pytest.mark.parametrize("nproc,stuck", [(3, 2)])   # the last rank of three
def test_a_rank_waiting_on_its_deadlocked_dataloader_worker_names_the_workers_frame(
        run_watch, nproc, stuck):
    # GIVEN a rank whose DataLoader workers were forked while another thread held the tokenizer
    # cache lock (pytorch/pytorch#130610): each worker waits on it forever in __getitem__
    result = run_watch(torchrun(nproc, "fork_lock_worker.py"), "--on-stall", "kill",
                       env={"STUCK_RANK": str(stuck)}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the rank is named, and so is where its worker is: the lock in tokenize(), which the
    # rank's own stack (the DataLoader's queue) does not show
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [stuck], finding["summary"]
    evidence = finding["evidence"]
    assert evidence["frame"].startswith("train ("), evidence
    child = evidence["waits_on_child"]
    assert child["what"] == "DataLoader worker" and child["waits_on_lock"], child
    assert child["frame"].startswith("tokenize (") and "fork_lock_worker.py" in child["frame"]
    assert any(f.startswith("PromptDataset.__getitem__ (") for f in child["frames"]), child
    report = result.report()
    rank_pids = {r["pid"] for r in report["ranks"]}
    assert child["pid"] not in rank_pids
    assert (f"waiting for its DataLoader worker {child['pid']}, which waits on a lock in "
            "tokenize (") in finding["summary"]
    assert "which waits on a lock in tokenize (" in result.rendered()


def killed_build(root: Path) -> tuple[Path, list[int]]:
    """DeepSpeed's CPU op build started into ``root`` (TORCH_EXTENSIONS_DIR) and killed once its
    compilers run, as a time limit or ``kill -9`` of its process group does: torch and ninja
    die, the compilers ninja started in process groups of their own go on. Those are stopped
    (SIGSTOP) where they are, so that they outlast the next job's start-up on any machine.
    Returns the lock left and the pids of the compilers' processes."""
    lock = root / "deepspeed_shm_comm" / "lock"
    build = subprocess.Popen([sys.executable, "-c", "from deepspeed.comm.torch import "
                              "build_shm_op\nbuild_shm_op()"], start_new_session=True,
                             env={**os.environ, "TORCH_EXTENSIONS_DIR": str(root)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while ("cc1plus" not in working_in(lock.parent).values() and build.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    os.killpg(build.pid, signal.SIGKILL)
    build.wait()
    left: dict[int, str] = {}
    for _ in range(2):   # a compiler driver may start its next step as the first pass stops it
        left = working_in(lock.parent)
        for pid in left:
            os.kill(pid, signal.SIGSTOP)
    assert lock.exists() and "cc1plus" in left.values(), ("the build never compiled", left)
    return lock, sorted(left)


def working_in(directory: Path) -> dict[int, str]:
    """The command names of the processes whose working directory is ``directory``."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cwd").readlink() == directory:
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:
            continue
    return found


def test_a_lock_left_by_a_killed_extension_build_is_named_with_its_file(run_watch, tmp_path):
    pytest.importorskip("deepspeed")
    # GIVEN a ZeRO-3 job whose DeepSpeed op build was killed mid-way in an earlier run: its
    # lock is still in the extensions directory (OpenRLHF#208: stuck after "Using ... as
    # PyTorch extensions root"), the build's compilers still in it, and every rank of the new
    # run sleeps on it at init
    root = tmp_path / "torch_extensions"
    lock, compilers = killed_build(root)
    try:
        result = run_watch(torchrun(2, "sharded_generate.py"), "--on-stall", "kill",
                           env={"MODE": "rank0", "SHARDING": "zero3",
                                "TORCH_EXTENSIONS_DIR": str(root)}, timeout=200)
    finally:
        for pid in compilers:
            os.kill(pid, signal.SIGKILL)
    assert result.code == 124, result.stderr[-3000:]
    # THEN the finding names both ranks, the lock file and that nobody builds, as an error,
    # with the fix that deletes it, and the compilers left as what they are; no vaguer SD106
    [finding] = result.findings("SD116")
    assert finding["ranks"] == [0, 1] and finding["severity"] == "error", finding["summary"]
    assert f"its lock is {lock} (written" in finding["summary"], finding["summary"]
    assert "which no process is building" in finding["summary"]
    assert "its compilers still run there" in finding["summary"]
    [said] = finding["evidence"]["locks"]
    assert said["path"] == str(lock) and said["builders"] == [], said
    assert said["leftovers"] == compilers, (said, compilers)
    assert finding["evidence"]["loader"].startswith("OpBuilder.jit_load ("), finding["evidence"]
    assert "delete the `lock` file" in finding["fix"]
    assert result.findings("SD106") == []
