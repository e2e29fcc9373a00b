"""A stage of the sidecar (and of ``check``): the rule catalogue, one file per rule with
a stable code, and the engine that runs it over a ``Window``.

May import: ``model``, ``analysis``, ``launch`` (the launch rules' arithmetic), ``agent`` (the
state file's status values), ``redact``, ``detect`` (a line the watcher reads as well: Ray's
request that no node can hold).
"""
from __future__ import annotations

import dataclasses

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.redact import redact_json, redact_text
from stalldoc.rules.base import Rule
from stalldoc.rules.sd101_rank_outside_collective import RankOutsideCollective
from stalldoc.rules.sd102_collective_mismatch import CollectiveMismatch
from stalldoc.rules.sd103_dead_rank import DeadRank
from stalldoc.rules.sd104_python_deadlock import PythonDeadlock
from stalldoc.rules.sd105_stopped_rank import StoppedRank
from stalldoc.rules.sd106_no_progress import NoProgress
from stalldoc.rules.sd107_waiting_on_server import WaitingOnServer
from stalldoc.rules.sd108_slow_rank import SlowRank
from stalldoc.rules.sd109_busy_without_progress import BusyWithoutProgress
from stalldoc.rules.sd110_rank_left_early import RankLeftEarly
from stalldoc.rules.sd111_hung_in_channel import HungInChannel
from stalldoc.rules.sd112_vllm_asleep import VllmAsleep
from stalldoc.rules.sd113_node_lost import NodeLost
from stalldoc.rules.sd114_waiting_on_other_nodes import WaitingOnOtherNodes
from stalldoc.rules.sd115_teardown_crash import TeardownCrash
from stalldoc.rules.sd116_extension_build_lock import ExtensionBuildLock
from stalldoc.rules.sd117_served_engine_stuck import ServedEngineStuck
from stalldoc.rules.sd118_rank_without_agent import RankWithoutAgent
from stalldoc.rules.sd119_finished_not_exiting import FinishedNotExiting
from stalldoc.rules.sd120_job_waits_outside_ranks import JobWaitsOutsideRanks
from stalldoc.rules.sd121_driver_spins import DriverSpins
from stalldoc.rules.sd122_engine_process_broken import EngineProcessBroken
from stalldoc.rules.sd201_offload_thrash import OffloadThrash
from stalldoc.rules.sd202_gpu_memory_pressure import GpuMemoryPressure
from stalldoc.rules.sd203_gpu_not_completing import GpuNotCompleting
from stalldoc.rules.sd204_gpu_idle_host_blocked import GpuIdleHostBlocked
from stalldoc.rules.sd205_gpu_shared_by_ranks import GpuSharedByRanks
from stalldoc.rules.sd206_idle_gpus import IdleGpus
from stalldoc.rules.sd207_weight_sync_bound import WeightSyncBound
from stalldoc.rules.sd208_rollout_gpu_idle import RolloutGpusIdle
from stalldoc.rules.sd301_host_memory_pressure import HostMemoryPressure
from stalldoc.rules.sd302_cpu_oversubscription import CpuOversubscription
from stalldoc.rules.sd401_max_model_len_config import MaxModelLenConfig
from stalldoc.rules.sd402_vllm_tp_layout import VllmTpLayout
from stalldoc.rules.sd403_async_generate_colocate import AsyncGenerateColocate
from stalldoc.rules.sd404_processes_vs_gpus import ProcessesVsGpus
from stalldoc.rules.sd405_offload_combination import OffloadCombination
from stalldoc.rules.sd406_generation_batch import GenerationBatch
from stalldoc.rules.sd407_num_generations import NumGenerations
from stalldoc.rules.sd408_eval_batch import EvalBatch
from stalldoc.rules.sd409_vllm_memory_budget import VllmMemoryBudget
from stalldoc.rules.sd410_checkpoint_size import CheckpointSize
from stalldoc.rules.sd411_version_clash import VersionClash
from stalldoc.rules.sd501_nccl_watchdog_timeout import NcclWatchdogTimeout
from stalldoc.rules.sd502_device_mismatch import DeviceMismatch
from stalldoc.rules.sd503_vllm_kv_cache_memory import VllmKvCacheMemory
from stalldoc.rules.sd504_expandable_segments_pool import ExpandableSegmentsPool
from stalldoc.rules.sd505_cumem_allocator_error import CumemAllocatorError
from stalldoc.rules.sd506_cuda_oom import CudaOom
from stalldoc.rules.sd507_rollout_server_unreachable import RolloutServerUnreachable
from stalldoc.rules.sd508_max_model_len_too_small import MaxModelLenTooSmall
from stalldoc.rules.sd509_async_generate_failed import AsyncGenerateFailed
from stalldoc.rules.sd510_vllm_preemption import VllmPreemption
from stalldoc.rules.sd511_nccl_watchdog_stuck import NcclWatchdogStuck
from stalldoc.rules.sd512_nccl_desync_report import NcclDesyncReport
from stalldoc.rules.sd513_nccl_watchdog_abort import NcclWatchdogAbort
from stalldoc.rules.sd514_c10d_store_timeout import C10dStoreTimeout
from stalldoc.rules.sd515_c10d_socket_connect import C10dSocketConnect
from stalldoc.rules.sd516_nccl_network_error import NcclNetworkError
from stalldoc.rules.sd517_nccl_error import NcclError
from stalldoc.rules.sd518_c10d_port_in_use import C10dPortInUse
from stalldoc.rules.sd519_flight_recorder_off import FlightRecorderOff
from stalldoc.rules.sd520_vllm_engine_dead import VllmEngineDead
from stalldoc.rules.sd521_vllm_shm_broadcast_wait import VllmShmBroadcastWait
from stalldoc.rules.sd522_vllm_rpc_timeout import VllmRpcTimeout
from stalldoc.rules.sd523_vllm_worker_method_failed import VllmWorkerMethodFailed
from stalldoc.rules.sd524_vllm_server_not_up import VllmServerNotUp
from stalldoc.rules.sd525_rollout_request_failed import RolloutRequestFailed
from stalldoc.rules.sd526_rollout_connection_dropped import RolloutConnectionDropped
from stalldoc.rules.sd527_deepspeed_cache_flushes import DeepspeedCacheFlushes
from stalldoc.rules.sd528_zero3_param_not_available import Zero3ParamNotAvailable
from stalldoc.rules.sd529_collective_mismatch_reported import CollectiveMismatchReported
from stalldoc.rules.sd530_vllm_engine_preempting import VllmEnginePreempting
from stalldoc.rules.sd531_ray_train_group_failed import RayTrainGroupFailed
from stalldoc.rules.sd532_ray_actor_died import RayActorDied
from stalldoc.rules.sd533_ray_node_dead import RayNodeDead
from stalldoc.rules.sd534_ray_unschedulable import RayUnschedulable
from stalldoc.rules.sd535_slurm_time_limit import SlurmTimeLimit
from stalldoc.rules.sd536_vllm_engine_not_started import VllmEngineNotStarted
from stalldoc.rules.sd537_vendor_hang_verdict import VendorHangVerdict
from stalldoc.rules.sd538_sglang_engine_process_died import SglangEngineProcessDied
from stalldoc.rules.sd539_out_of_memory import OutOfMemory
from stalldoc.rules.sd540_cuda_fault import CudaFault
from stalldoc.rules.sd541_ranks_out_of_step import RanksOutOfStep
from stalldoc.rules.sd542_monitor_verdict import MonitorVerdict
from stalldoc.rules.sd543_process_died import ProcessDied
from stalldoc.rules.sd544_filesystem_error import FilesystemError
from stalldoc.rules.sd545_hub_network_error import HubNetworkError
from stalldoc.rules.sd546_server_request_raised import ServerRequestRaised

RULES: tuple[type[Rule], ...] = (RankOutsideCollective, CollectiveMismatch, DeadRank,
                                 PythonDeadlock, StoppedRank, NoProgress, WaitingOnServer,
                                 SlowRank, BusyWithoutProgress, RankLeftEarly, HungInChannel,
                                 VllmAsleep, NodeLost, WaitingOnOtherNodes, TeardownCrash,
                                 ExtensionBuildLock, ServedEngineStuck, RankWithoutAgent,
                                 FinishedNotExiting, JobWaitsOutsideRanks, DriverSpins,
                                 EngineProcessBroken,
                                 OffloadThrash, GpuMemoryPressure, GpuNotCompleting,
                                 GpuIdleHostBlocked, GpuSharedByRanks, IdleGpus, WeightSyncBound,
                                 RolloutGpusIdle,
                                 HostMemoryPressure, CpuOversubscription, MaxModelLenConfig,
                                 VllmTpLayout, AsyncGenerateColocate, ProcessesVsGpus,
                                 OffloadCombination, GenerationBatch, NumGenerations, EvalBatch,
                                 VllmMemoryBudget, CheckpointSize, VersionClash,
                                 NcclWatchdogTimeout, DeviceMismatch, VllmKvCacheMemory,
                                 ExpandableSegmentsPool, CumemAllocatorError, CudaOom,
                                 RolloutServerUnreachable, MaxModelLenTooSmall, AsyncGenerateFailed,
                                 VllmPreemption, NcclWatchdogStuck, NcclDesyncReport,
                                 NcclWatchdogAbort, C10dStoreTimeout, C10dSocketConnect,
                                 NcclNetworkError, NcclError, C10dPortInUse, FlightRecorderOff,
                                 VllmEngineDead, VllmShmBroadcastWait, VllmRpcTimeout,
                                 VllmWorkerMethodFailed, VllmServerNotUp, RolloutRequestFailed,
                                 RolloutConnectionDropped, DeepspeedCacheFlushes,
                                 Zero3ParamNotAvailable, CollectiveMismatchReported,
                                 VllmEnginePreempting, RayTrainGroupFailed, RayActorDied,
                                 RayNodeDead, RayUnschedulable, SlurmTimeLimit,
                                 VllmEngineNotStarted, VendorHangVerdict,
                                 SglangEngineProcessDied, OutOfMemory, CudaFault,
                                 RanksOutOfStep, MonitorVerdict, ProcessDied, FilesystemError,
                                 HubNetworkError, ServerRequestRaised)
STICKY: frozenset[str] = frozenset(rule.code for rule in RULES if rule.sticky)
ENDS_WITH_PROGRESS: frozenset[str] = frozenset(rule.code for rule in RULES
                                               if rule.ends_with_progress)
SETTLE: dict[str, float] = {rule.code: rule.settle_seconds for rule in RULES
                            if rule.settle_seconds}


def by_code(code: str) -> type[Rule] | None:
    return next((rule for rule in RULES if rule.code == code.upper()), None)


def run_rules(window: Window, trigger: str) -> list[Finding]:
    """Every rule of ``trigger``; fallback rules only when the others found nothing but info.
    Their summaries and evidence come back redacted: whatever a rule quotes (a log line, an
    exception, a setting) is stored, printed and counted only this way."""
    rules = [rule() for rule in RULES if rule.trigger == trigger]
    findings = [f for rule in rules if not rule.fallback for f in rule.check(window)]
    if all(f.severity is Severity.INFO for f in findings):  # nothing explained it yet
        findings += [f for rule in rules if rule.fallback for f in rule.check(window)]
    return [redacted(f) for f in findings]


def redacted(finding: Finding) -> Finding:
    """The finding with its summary and evidence redacted."""
    return dataclasses.replace(finding, summary=redact_text(finding.summary),
                               evidence=redact_json(finding.evidence))
