"""SGLang's facts, as its released source has them: the wheels of 0.4.6.post5 (verl's old pin),
0.5.2 and 0.5.23 read file by file (``python/sglang/srt/``). SGLang's main process (the HTTP
server, or the ``Engine`` a verl or slime actor holds) spawns one scheduler per TP / PP rank;
the schedulers create their own torch.distributed world (``init_distributed_environment``
with ``tcp://`` at a port SGLang chose) and run the model's collectives through their group
coordinator and device communicators."""
from __future__ import annotations

from stalldoc.engines.facts import Engine, HookPoint, WaitFrame

TP_COLLECTIVE = "SGLang TP collective"
DP_SYNC = "SGLang data-parallel sync"
COLLECTIVE = "SGLang collective"
# srt/distributed/device_communicators/ (pynccl, custom_all_reduce in every release; quick
# all-reduce, mscclpp, symmetric memory and the v2 custom all-reduce in 0.5)
DEVICE_COMMUNICATORS = ("pynccl", "pynccl_wrapper", "custom_all_reduce", "custom_all_reduce_v2",
                        "custom_all_reduce_ops", "quick_all_reduce", "pymscclpp",
                        "torch_symm_mem", "triton_symm_mem_ag", "pcie_ipc_ar",
                        "xpu_communicator", "hpu_communicator", "npu_communicator")
# GroupCoordinator's collectives (srt/distributed/parallel_state.py) and the module's custom
# ops that torch.compile and CUDA graphs call them through
COORDINATOR = frozenset({"all_reduce", "_all_reduce_out_place", "_all_reduce_in_place",
                         "inplace_all_reduce", "outplace_all_reduce", "quant_all_reduce",
                         "fused_allreduce_rmsnorm", "fused_allreduce_rmsnorm_quant_per_group",
                         "flashinfer_allreduce", "_flashinfer_allreduce",
                         "reduce_scatter_tensor", "_reduce_scatter_tensor",
                         "reg_reduce_scatter_tensor", "reduce_scatter", "reduce_scatterv",
                         "reduce_scatter_along_dim", "_deterministic_reduce_scatterv",
                         "all_to_all_single", "_all_to_all_single", "reg_all_to_all_single",
                         "all_gather_into_tensor", "_all_gather_into_tensor",
                         "reg_all_gather_into_tensor", "all_gather", "all_gatherv",
                         "_all_gather_single", "gather", "broadcast", "broadcast_object",
                         "broadcast_object_list", "all_gather_object", "send_object",
                         "recv_object", "broadcast_tensor_dict", "send_tensor_dict",
                         "recv_tensor_dict", "send_recv_tensor_dict", "barrier", "send",
                         "recv"})

_ENGINE = "sglang.srt.entrypoints.engine"
# the functions the agent wraps: the offline Engine a verl or slime actor holds (its generate
# and its weight updates, in that actor's process) and each scheduler's forward (its progress,
# in the scheduler's process); srt/entrypoints/engine.py and srt/managers/scheduler.py, 0.5.23
HOOKS = (
    HookPoint(_ENGINE, "Engine.generate", "generate", None),
    *(HookPoint(_ENGINE, f"Engine.{m}", "weight_sync", None)
      for m in ("init_weights_update_group", "update_weights_from_distributed",
                "update_weights_from_tensor", "update_weights_from_disk",
                "update_weights_from_ipc")),
    HookPoint("sglang.srt.managers.scheduler", "Scheduler.run_batch", None, None))

SGLANG = Engine(
    name="SGLang", package="sglang", claim="SGLang engine", worker="scheduler",
    core="engine", tp_collective=TP_COLLECTIVE, collective=COLLECTIVE,
    waits=(
        # the group coordinator of the schedulers' TP / PP / DP-attention / EP groups
        WaitFrame("sglang/srt/distributed/parallel_state.py", COORDINATOR, TP_COLLECTIVE),
        WaitFrame("sglang/srt/distributed/communication_op.py", None, TP_COLLECTIVE),
        # the device communicators: the kernel waits on the GPU for every peer, the host thread
        # in the launch, the rendezvous or the sync
        WaitFrame(f"sglang/srt/distributed/device_communicators/"
                  f"({'|'.join(DEVICE_COMMUNICATORS)}).py", None, COLLECTIVE),
        # the weight-update group a trainer and the schedulers make (update_weights_from_
        # distributed): its rendezvous waits for the trainer (srt/utils/common.py in 0.5.23,
        # srt/utils.py before)
        WaitFrame("sglang/srt/utils(/common)?.py", frozenset({"init_custom_process_group"}),
                  COLLECTIVE),
    ),
    # the Engine (its tokenizer manager) runs in the process that made it: the schedulers are
    # that process's children (entrypoints/engine.py, _launch_scheduler_processes)
    core_process=False,
    dp_sync=(
        # DP attention: before each forward the schedulers of every DP rank exchange their
        # batches' sizes and modes (an all_gather, or an all_reduce on the world group), an
        # idle one running an idle batch (srt/managers/scheduler_components/dp_attn.py, 0.5.23)
        WaitFrame("sglang/srt/managers/scheduler_components/dp_attn.py",
                  frozenset({"prepare_mlp_sync_batch_raw", "prepare_mlp_sync_batch",
                             "exchange_sync_rows"}), DP_SYNC),
    ),
    hooks=HOOKS)
